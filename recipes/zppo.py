"""Train a student with ZPPO.

    accelerate launch recipes/zppo.py --config recipes/qwen35_0.8b.yaml [--any_field value ...]
    python recipes/zppo.py --config recipes/qwen35_0.8b.yaml --dry_run    # check and print the plan

The YAML sets fields of three dataclasses: `ScriptArguments` below (the dataset and what
this script does), `zppo_trl.ZPPOConfig` (training and the ZPPO method) and
`trl.ModelConfig` (the student). Any field can be overridden on the command line. A YAML with
a `base:` key (the paper's comparison rows, `recipes/rows/`) is that base recipe with the
YAML's own fields on top.

A run validates its dataset up front, loads the student (a VLM when its config has a vision
tower, else a causal LM) with its processor, grades with the boxed grader (plus the judge
fallback when a judge endpoint is configured), waits for the teacher, resumes from the
last checkpoint in `output_dir` (replay buffer included), logs `metrics.jsonl` next to
the checkpoints, and writes (and with `push_to_hub`, pushes) a model card.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import yaml

import torch
import transformers
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, ModelConfig, TrlParser, get_peft_config

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.callbacks import JsonlMetricsCallback
from zppo_trl.data import is_hub_id, load_questions
from zppo_trl.processing import load_processor
from zppo_trl.rewards import boxed_accuracy_reward, judged_accuracy_reward
from zppo_trl.teacher import TeacherClient

logger = logging.getLogger("zppo")


@dataclass
class ScriptArguments:
    """What to train on, and what this script does besides training."""

    dataset_name: str = field(
        default="zppo-trl/ZPPO-77K",
        metadata={"help": "Hub dataset id, or a local .parquet/.jsonl file, a folder of them, or a save_to_disk folder (schema of zppo_trl.data)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    skip_invalid: bool = field(
        default=False,
        metadata={"help": "Drop rows that break the schema (counted and logged) instead of stopping at the first one."},
    )
    use_judge: bool = field(
        default=True,
        metadata={"help": "Send answers the boxed grader scores 0 to the judge (judge_base_url, by default the teacher's server)."},
    )
    teacher_wait_s: float = field(
        default=900.0,
        metadata={"help": "Seconds to wait for the teacher (and judge) to answer /v1/models before training; 0 skips the check."},
    )
    num_training_ranks: int | None = field(
        default=None,
        metadata={"help": "Training processes the recipe is sized for; a dry run plans for it, a real run warns when the launch differs."},
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "Validate config, dataset, model config and servers without loading weights; print the step composition and process layout."},
    )
    model_license: str | None = field(
        default=None,
        metadata={"help": "License id for the model card's metadata, e.g. apache-2.0 (the student's license; left out when unset)."},
    )
    print_server_lengths: bool = field(
        default=False,
        metadata={"help": "Print the student's and the teacher's server --max-model-len for this recipe (two numbers) and exit; recipes/launch uses it."},
    )


# ---------------------------------------------------------------------- building blocks


def _hub_kwargs(model_args: ModelConfig) -> dict:
    return {"revision": model_args.model_revision, "trust_remote_code": getattr(model_args, "trust_remote_code", False)}


def student_config(model_args: ModelConfig):
    """The student's `transformers` config (no weights)."""
    return transformers.AutoConfig.from_pretrained(model_args.model_name_or_path, **_hub_kwargs(model_args))


def is_vision_language(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def load_student(model_args: ModelConfig):
    """The student model (VLM or causal LM, from its config) and its processor."""
    config = student_config(model_args)
    model_class = transformers.AutoModelForImageTextToText if is_vision_language(config) else transformers.AutoModelForCausalLM
    kwargs = _hub_kwargs(model_args)
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if model_args.dtype not in (None, "auto"):
        kwargs["dtype"] = getattr(torch, model_args.dtype)
    model = model_class.from_pretrained(model_args.model_name_or_path, **kwargs)
    processor = load_processor(model_args.model_name_or_path, **_hub_kwargs(model_args))
    return model, processor


def reward_functions(script_args: ScriptArguments, args: ZPPOConfig) -> list:
    """The boxed grader, routed to the judge on zeros when a judge endpoint is configured."""
    if script_args.use_judge and args.judge_base_url and args.judge_model:
        return [judged_accuracy_reward(TeacherClient.from_config(args, role="judge"))]
    return [boxed_accuracy_reward]


def endpoints(script_args: ScriptArguments, args: ZPPOConfig) -> list[tuple[str, str, str]]:
    """(role, base_url, model) of every server the run talks to besides the student's vLLM."""
    out = []
    if args.augmentations or args.distillation == "off":
        out.append(("teacher", args.teacher_base_url, args.teacher_model))
    if script_args.use_judge and args.judge_base_url and args.judge_model:
        if not out or (args.judge_base_url, args.judge_model) != (out[0][1], out[0][2]):
            out.append(("judge", args.judge_base_url, args.judge_model))
    return out


def wait_for_servers(script_args: ScriptArguments, args: ZPPOConfig) -> None:
    """Block until the teacher/judge answer, or raise naming the field to fix."""
    if script_args.teacher_wait_s <= 0:
        return
    for role, url, model in endpoints(script_args, args):
        client = TeacherClient(url, model, api_key_env=args.teacher_api_key_env)
        deadline = time.monotonic() + script_args.teacher_wait_s
        try:
            while not client.health(timeout=10.0):
                if time.monotonic() > deadline:
                    field_name = "teacher_base_url / teacher_model" if role == "teacher" else "judge_base_url / judge_model"
                    raise SystemExit(
                        f"the {role} at {url} (model {model!r}) did not answer within teacher_wait_s={script_args.teacher_wait_s:g} s; "
                        f"start it (recipes/launch/) or fix {field_name}"
                    )
                logger.info("waiting for the %s at %s ...", role, url)
                time.sleep(5.0)
        finally:
            client.close()
        logger.info("%s at %s is up (model %s)", role, url, model)


def generation_backend(args: ZPPOConfig) -> str:
    if not args.use_vllm:
        return "transformers generate on each training rank (use_vllm: false)"
    if args.vllm_mode == "server":
        url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        return f"TRL vLLM server at {url} (start it with `trl vllm-serve`, see recipes/launch/)"
    return f"vLLM colocated on each training rank (tensor parallel {args.vllm_tensor_parallel_size})"


# ---------------------------------------------------------------------- dry run


def dry_run(script_args: ScriptArguments, args: ZPPOConfig, model_args: ModelConfig) -> int:
    """Validate what can be validated without weights and print the plan. Returns an exit code."""
    out = print
    problems: list[str] = []
    launched = args.world_size
    ranks = script_args.num_training_ranks or launched
    composition = args.composition(ranks)
    out(f"ZPPO dry run: {args.variant}")
    out(composition)

    out("\nprocess layout:")
    note = "" if ranks == launched else f" (this launch has {launched}; planned for num_training_ranks)"
    out(f"  training ranks: {ranks}{note}")
    rows = args.per_device_train_batch_size * args.steps_per_generation
    out(
        f"  per rank: {rows} rows per rollout step ({rows // args.num_generations} new prompt groups); micro-batches of "
        f"{composition.rows_per_micro_batch} rows x {composition.micro_batches_per_update} per update "
        "(replayed and reformulated groups add rows)"
    )
    out(f"  student rollouts: {generation_backend(args)}")
    if args.augmentations:
        cap = args.compression_max_tokens
        use = {
            "hint": f"hints <= {cap} tokens",
            "prefix": f"response prefix alpha={args.prefix_fraction:g}",
            "correction": "corrects one wrong rollout per hard question; graded SFT targets",
            "reflection": "revises a correct draft with the wrong rollouts; graded SFT targets",
        }.get(args.augmentations[0], f"compression <= {cap} tokens" if args.compress_candidates else "candidates uncompressed (compress_candidates: false)")
        out(f"  teacher: {args.teacher_model} at {args.teacher_base_url} (G_T={args.teacher_num_generations}, {use})")
    if args.distillation:
        out(f"  distillation: {args.variant} against {args.distill_teacher}, loaded next to the student on every rank (GKD JSD, beta={args.distill_beta:g})")
    judging = script_args.use_judge and args.judge_base_url and args.judge_model
    out(f"  judge: {f'{args.judge_model} at {args.judge_base_url}' if judging else 'off (boxed grader only)'}")
    if composition.rollout_steps is not None:
        draws = composition.rollout_steps * composition.new_prompts
        out(f"  schedule: {composition.rollout_steps} rollout steps = {args.max_steps} optimizer updates = {draws:,} new-prompt draws")
    precision = "bf16" if args.bf16 else "fp32"
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    out(f"  precision: {precision}; lr {args.learning_rate:g} {schedule}; max completion {args.max_completion_length} tokens")
    out(f"  server context: {args.context_lengths()}")
    if args.use_vllm and args.vllm_max_model_length < args.context_lengths().student:
        out(f"        vllm_max_model_length={args.vllm_max_model_length} is smaller: BCQ/NCQ rollouts can be cut short")

    out("\nchecks:")
    # model: config only
    try:
        config = student_config(model_args)
        kind = "vision-language" if is_vision_language(config) else "text"
        out(f"  ok    student {model_args.model_name_or_path}: {config.model_type} ({kind})")
    except Exception as err:  # noqa: BLE001 - reported, not raised: a dry run lists every problem
        if not is_hub_id(model_args.model_name_or_path):
            problems.append(f"student {model_args.model_name_or_path}: {err}")
            out(f"  FAIL  student {model_args.model_name_or_path}: {err}")
        else:
            out(f"  skip  student {model_args.model_name_or_path}: config not reachable here ({type(err).__name__}: {str(err).splitlines()[0][:100]})")
    if args.distillation:  # the teacher loaded next to the student: its config only
        try:
            transformers.AutoConfig.from_pretrained(args.distill_teacher)
            out(f"  ok    distill_teacher {args.distill_teacher}")
        except Exception as err:  # noqa: BLE001 - reported, not raised
            if not is_hub_id(args.distill_teacher):
                reason = err if os.path.exists(args.distill_teacher) else "no such directory"
                problems.append(f"distill_teacher {args.distill_teacher}: {reason}")
                out(f"  FAIL  distill_teacher {args.distill_teacher}: {reason}")
            else:
                out(f"  skip  distill_teacher {args.distill_teacher}: config not reachable here ({type(err).__name__})")
    # dataset: every row when local
    if not is_hub_id(script_args.dataset_name):  # a local path, existing or not (see zppo_trl.data.is_hub_id)
        try:
            dataset, skipped = load_questions(script_args.dataset_name, script_args.dataset_split, skip_invalid=script_args.skip_invalid)
            extra = f", {len(skipped)} invalid rows would be skipped" if skipped else ""
            out(f"  ok    dataset {script_args.dataset_name}: {len(dataset):,} valid rows{extra}")
            if composition.rollout_steps is not None and draws > len(dataset):
                out(f"        ({draws:,} draws is {draws / len(dataset):.2f} epochs of it)")
        except Exception as err:  # noqa: BLE001
            problems.append(f"dataset {script_args.dataset_name}: {err}")
            out(f"  FAIL  dataset {script_args.dataset_name}: {err}")
    else:
        out(f"  skip  dataset {script_args.dataset_name}: a Hub id (org/name); rows are validated when the run loads it")
    # servers
    for role, url, model in endpoints(script_args, args):
        client = TeacherClient(url, model, api_key_env=args.teacher_api_key_env, max_retries=0)
        healthy = client.health(timeout=5.0)
        client.close()
        out(f"  {'ok  ' if healthy else 'down'}  {role} {model} at {url}{'' if healthy else ' (not reachable now; start it before training)'}")
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    out(f"  ok    output_dir {args.output_dir}: {'resumes from ' + last if last else 'starts fresh'}")
    if args.push_to_hub:
        out(f"  ok    pushes checkpoints and the final model to {args.hub_model_id} (hub_strategy {args.hub_strategy})")

    if problems:
        out(f"\n{len(problems)} problem(s); nothing was trained.")
        return 1
    out("\ndry run ok; nothing was trained.")
    return 0


# ---------------------------------------------------------------------- training


def train(script_args: ScriptArguments, args: ZPPOConfig, model_args: ModelConfig) -> None:
    if script_args.num_training_ranks and script_args.num_training_ranks != args.world_size:
        logger.warning(
            "this recipe is sized for %d training ranks but %d were launched: the step holds %s",
            script_args.num_training_ranks,
            args.world_size,
            args.composition(args.world_size),
        )
    logger.info("%s on %d rank(s): %s", args.variant, args.world_size, args.composition(args.world_size))
    dataset, skipped = load_questions(
        script_args.dataset_name, script_args.dataset_split, name=script_args.dataset_config, skip_invalid=script_args.skip_invalid
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
        callbacks=[JsonlMetricsCallback()],
    )
    checkpoint = args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(args.output_dir):
        checkpoint = get_last_checkpoint(args.output_dir)
    if checkpoint:
        logger.info("resuming from %s (replay buffer and ZPPO counters included)", checkpoint)
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(args.output_dir)
    trainer.create_model_card()
    if args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # PyTorch asks every script to destroy its process group at the end; a group left to interpreter
    # teardown can abort a rank (SIGABRT) after a successful run (pytorch/pytorch#190489; the
    # 2-process test saw such aborts even after it). Only on success: destroying the group while
    # another rank is mid-collective would hang.
    trainer.accelerator.end_training()
    logger.info("done: %s", args.output_dir)


def build_parser() -> TrlParser:
    """The recipe's parser, its ``--help`` grouped: ZPPO's own fields first, then this script's, the TRL
    fields whose defaults the paper changes, the student's, and every other training field last."""
    parser = TrlParser((ScriptArguments, ZPPOConfig, ModelConfig))
    zppo_own = set(ZPPOConfig.__annotations__)
    groups = [
        ("ZPPO (zppo_trl.ZPPOConfig)", zppo_own - set(GRPOConfig.__dataclass_fields__)),
        ("this script (recipes/zppo.py)", set(ScriptArguments.__dataclass_fields__)),
        ("TRL fields at the paper's values", zppo_own & set(GRPOConfig.__dataclass_fields__)),
        ("the student (trl.ModelConfig)", set(ModelConfig.__dataclass_fields__) - set(ZPPOConfig.__dataclass_fields__)),
    ]
    parser.usage = (
        "accelerate launch recipes/zppo.py --config YAML [--FIELD VALUE ...]\n"
        "       python recipes/zppo.py --config YAML --dry_run     (check it, print the plan; trains nothing)"
    )
    by_dest: dict[str, list] = {}  # --flag and --no_flag share a dest
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    ordered = []
    for title, names in groups:
        group = parser.add_argument_group(title)
        for name in [dest for dest in by_dest if dest in names]:
            for action in by_dest.pop(name):
                for container in parser._action_groups:
                    if action in container._group_actions:
                        container._group_actions.remove(action)
                group._group_actions.append(action)
        ordered.append(group)
    rest = [group for group in parser._action_groups if group not in ordered]
    for group in rest:
        if group.title == "options":
            group.title = "training (trl.GRPOConfig, transformers.TrainingArguments)"
    parser._action_groups[:] = ordered + rest  # argparse prints groups in this order
    return parser


def load_recipe(path: str, _seen: tuple[str, ...] = ()) -> dict:
    """The fields of a recipe YAML; a ``base:`` (relative to the YAML) is loaded first and overridden."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ValueError(f"{path}: base recipes form a cycle ({' -> '.join(_seen + (path,))})")
    if not os.path.isfile(path):
        raise ValueError(f"config {path} does not exist" + (f" (the base of {_seen[-1]})" if _seen else ""))
    with open(path) as f:
        fields = yaml.safe_load(f) or {}
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: a recipe is a mapping of field: value")
    base = fields.pop("base", None)
    if base is None:
        return fields
    return {**load_recipe(os.path.join(os.path.dirname(path), base), (*_seen, path)), **fields}


def _resolve_base(argv: list[str]) -> list[str]:
    """``argv`` with a ``--config`` that has a ``base:`` replaced by the merged recipe (a temporary file)."""
    if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
        return argv
    at = argv.index("--config") + 1
    with open(argv[at]) as f:
        if "base" not in (yaml.safe_load(f) or {}):
            return argv
    merged = tempfile.NamedTemporaryFile("w", prefix="zppo-recipe-", suffix=".yaml", delete=False)
    with merged:
        yaml.safe_dump(load_recipe(argv[at]), merged)
    return [*argv[:at], merged.name, *argv[at + 1 :]]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _resolve_base(argv)
    except (OSError, ValueError, yaml.YAMLError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    if any(flag in argv for flag in ("--dry_run", "--print_server_lengths")) and "--use_cpu" not in argv:
        if not torch.cuda.is_available():  # validate a GPU recipe here: bf16 on CPU needs use_cpu
            argv += ["--use_cpu", "true"]
    # TRL's GRPOConfig turns on `gradient_checkpointing`, which transformers 5 deprecates on every
    # config built; nothing a user of this recipe can act on.
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
    try:
        script_args, args, model_args = build_parser().parse_args_and_config(argv)
    except (ValueError, TypeError) as err:  # a bad field or value: one line naming it, not a traceback
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    if not model_args.model_name_or_path:
        print("error: model_name_or_path is required (the student, e.g. Qwen/Qwen3.5-0.8B)", file=sys.stderr)
        return 2
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO if args.should_log else logging.WARNING)
    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per teacher request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if script_args.print_server_lengths:
        lengths = args.context_lengths()
        print(lengths.student, lengths.teacher)
        return 0
    if script_args.dry_run:
        return dry_run(script_args, args, model_args)
    train(script_args, args, model_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
