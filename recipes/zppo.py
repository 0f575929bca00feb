"""Train a student with ZPPO.

    accelerate launch recipes/zppo.py --config recipes/qwen35_0.8b.yaml [--any_field value ...]
    python recipes/zppo.py --config recipes/qwen35_0.8b.yaml --dry_run    # check and print the plan

The YAML sets fields of three dataclasses: `zppo_trl.recipe.ScriptArguments` (the dataset and
what this script does), `zppo_trl.ZPPOConfig` (training and the ZPPO method) and
`trl.ModelConfig` (the student). Any field can be overridden on the command line. A YAML with
a `base:` key (the paper's comparison rows, `recipes/rows/`) is that base recipe with the
YAML's own fields on top (`zppo_trl.recipe.load_recipe`).

A run validates its dataset up front, loads the student (a VLM when its config has a vision
tower, else a causal LM) with its processor, grades with the boxed grader (plus the judge
fallback when a judge endpoint is configured), waits for the teacher, resumes from the
last checkpoint in `output_dir` (replay buffer included), logs `metrics.jsonl` next to
the checkpoints, and writes (and with `push_to_hub`, pushes) a model card. The dry run is
`zppo_trl.plan.dry_run`.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from trl import ModelConfig, get_peft_config

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.callbacks import JsonlMetricsCallback
from zppo_trl.checkpoint_state import CheckpointWriteError, last_complete_checkpoint
from zppo_trl.data import DatasetError, load_questions
from zppo_trl.plan import dry_run
from zppo_trl.preemption import PREEMPTED_EXIT
from zppo_trl.rank_digest import RankDigestCallback
from zppo_trl.recipe import (
    RecipeError,
    ScriptArguments,
    load_student,
    parse_recipe_args,
    release_distributed,
    reward_functions,
    wait_for_servers,
)

logger = logging.getLogger("zppo")


def train(
    script_args: ScriptArguments, args: ZPPOConfig, model_args: ModelConfig, callbacks: list | None = None
) -> int:
    """Train as the recipe says; ``callbacks`` join the metrics file (benchmarks/bench_memory.py adds a probe).
    Returns the exit status: 0, or :data:`zppo_trl.preemption.PREEMPTED_EXIT` where a stop signal ended the run at a
    checkpoint (nothing else is written then: the requeued job resumes from it and finishes the run)."""
    if script_args.num_training_ranks and script_args.num_training_ranks != args.world_size:
        logger.warning(
            "this recipe is sized for %d training ranks but %d were launched: the step holds %s",
            script_args.num_training_ranks,
            args.world_size,
            args.composition(args.world_size),
        )
    logger.info("%s on %d rank(s): %s", args.variant, args.world_size, args.composition(args.world_size))
    dataset, skipped = load_questions(
        script_args.dataset_name,
        script_args.dataset_split,
        name=script_args.dataset_config,
        skip_invalid=script_args.skip_invalid,
    )
    logger.info("dataset %s: %d rows (%d skipped as invalid)", script_args.dataset_name, len(dataset), len(skipped))
    wait_for_servers(script_args, args)
    model, processor = load_student(model_args)
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=reward_functions(script_args, args),
        args=args,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
        dataset_name=script_args.dataset_name,
        model_license=script_args.model_license,
        callbacks=[JsonlMetricsCallback(), *(callbacks or [])],
    )
    if script_args.rank_digests:  # each rank's weights and decisions, for checking that the ranks agree
        trainer.add_callback(RankDigestCallback(trainer.zppo_state, trainer.accelerator.process_index))
    checkpoint = args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(args.output_dir):
        checkpoint = last_complete_checkpoint(args.output_dir)
    if checkpoint:
        logger.info("resuming from %s (replay buffer and ZPPO counters included)", checkpoint)
    trainer.train(resume_from_checkpoint=checkpoint)
    # a stop signal: the last rollout step is checkpointed, the job is requeued. Where that step was the run's last,
    # the run ends here instead (its final model and card), rather than a requeue that would only write them.
    if trainer.preemption.preempted and trainer.state.global_step < trainer.state.max_steps:
        return PREEMPTED_EXIT
    trainer.save_model(args.output_dir)
    trainer.create_model_card()
    if args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # PyTorch asks every script to destroy its process group at the end: a group left to interpreter
    # teardown can abort a rank (SIGABRT) after a successful run (pytorch/pytorch#190489), and one freed
    # with the trainer can hang it (release_distributed says why the trainer goes first). Only on success:
    # destroying the group while another rank is mid-collective would hang.
    accelerator = trainer.accelerator
    del trainer
    release_distributed(accelerator)
    logger.info("done: %s", args.output_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # TRL's GRPOConfig turns on `gradient_checkpointing`, which transformers 5 deprecates on every
    # config built; nothing a user of this recipe can act on.
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
    try:
        script_args, args, model_args = parse_recipe_args(argv)
    except RecipeError as err:  # a bad recipe, field or value: one line naming it, not a traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    level = logging.INFO if args.should_log else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per teacher request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if script_args.print_server_lengths:
        lengths = args.context_lengths()
        print(lengths.student, lengths.teacher)
        return 0
    if script_args.dry_run:
        return dry_run(script_args, args, model_args)
    try:
        return train(script_args, args, model_args)
    except DatasetError as err:  # found before training: one line naming the file, row or field
        print(f"error: dataset {script_args.dataset_name}: {err}", file=sys.stderr)
        return 2
    except CheckpointWriteError as err:  # a full disk: the path, the errno and the checkpoint to resume from
        print(f"error: {err.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
