"""`ZPPOTrainer` in 2 CPU processes (gloo) under `accelerate launch`: every decision is replicated.

The module's runs are launched once, together, by :func:`two_ranks.launch` (``tests/distributed_worker.py``
trains them one after the other in the same two processes and writes one JSON per run and rank); the tests
compare the ranks' records. ZPPO with its rollouts on a student vLLM server is checked the same way
(:func:`two_ranks.check_zppo_run`) in ``test_student_server.py``, on that module's server.

GRPO† setting: 3 new questions per rank (|X_new| = 6 over both ranks), replay fraction 0.5,
so up to 3 replays per step, which two ranks split 2 + 1: rank 1 scores a *filler* group,
and a partition where rank 1 has fewer rows is padded with zero-weight rows.

ZPPO setting (the boxed student and a real teacher server, which samples and compresses):
at most 3 BCQ/NCQ instances per step, dealt 2 + 1, so rank 1 scores a filler in the
reformulated round too. Correction-SFT and On-Distill train without RL on the same questions.
"""

from __future__ import annotations

import pytest
import yaml
from boxed_models import toy_rows
from two_ranks import REPO_ROOT, STEPS_PER_ROLLOUT, WORLD, accelerate, check_zppo_run, environment, launch
from two_ranks import groups as _groups
from two_ranks import rows as _rows

from zppo_trl.data import write_jsonl

pytestmark = pytest.mark.integration

G = 4
REPLAY_FRACTION = 0.5


@pytest.fixture(scope="class")
def runs(
    tiny_text_model_dir, boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path_factory
) -> dict[str, list[dict]]:
    """The module's two-process runs, in one launch: GRPO† (3 rollout steps; stopped by a signal and resumed, twice),
    ZPPO (3), Correction-SFT and On-Distill (2 each)."""
    teacher = dict(teacher_url=boxed_teacher_server.base_url, teacher_model=boxed_teacher_server.model)
    student = str(boxed_text_student_dir)
    without_rl = dict(max_steps=2 * STEPS_PER_ROLLOUT, distill_teacher=str(boxed_text_teacher_dir), **teacher)
    grpo = dict(mode="grpo", model_dir=str(tiny_text_model_dir), max_steps=3 * STEPS_PER_ROLLOUT)
    return launch(
        tmp_path_factory.mktemp("distributed"),
        [
            dict(name="grpo", **grpo),
            # the same run, rank 1 alone signalled in the middle of rollout step 2, then resumed to its end
            dict(name="grpo-preempted", **grpo, signal_rank=1, signal_step=STEPS_PER_ROLLOUT + 1),
            dict(name="grpo-resumed", **grpo, resume_of="grpo-preempted"),
            # rank 1 alone signalled before rollout step 2 generates, with a grace period no step fits: both ranks
            # leave that step once its plain round is scored, checkpoint its start, and the resume ends alike
            dict(
                name="grpo-abandoned",
                **grpo,
                signal_rank=1,
                signal_step=STEPS_PER_ROLLOUT + 1,
                signal_at_begin=True,
                grace=0.0,
            ),
            dict(name="grpo-abandoned-resumed", **grpo, resume_of="grpo-abandoned"),
            dict(name="zppo", mode="zppo", model_dir=student, max_steps=3 * STEPS_PER_ROLLOUT, **teacher),
            dict(name="correction", mode="correction", model_dir=student, **without_rl),
            dict(name="on-distill", mode="on-distill", model_dir=student, **without_rl),
        ],
    )


@pytest.fixture(scope="class")
def grpo_run(runs) -> list[dict]:
    """The GRPO† run's two records (rank 0, rank 1)."""
    return runs["grpo"]


class TestTwoProcessRuns:
    """Everything read off the module's one launch (a class: one pytest-xdist worker runs all of it)."""

    # ---------------------------------------------------------------------- GRPO† (no teacher)

    def test_two_gloo_processes(self, grpo_run):
        assert [r["rank"] for r in grpo_run] == [0, 1]
        assert all(
            r["world"] == WORLD and r["backend"] == "gloo" and r["distributed_type"] == "DistributedType.MULTI_CPU"
            for r in grpo_run
        )
        assert all(len(r["rollout_steps"]) == 3 and len(r["micro_steps"]) == 3 * STEPS_PER_ROLLOUT for r in grpo_run)

    def test_replicated_state_is_identical(self, grpo_run):
        rank0, rank1 = grpo_run
        assert rank0["residents"] and rank0["residents"] == rank1["residents"]
        assert rank0["counters"] == rank1["counters"]
        assert rank0["counters"]["rollout_steps"] == 3
        assert rank0["rng"] == rank1["rng"]
        for s0, s1 in zip(rank0["rollout_steps"], rank1["rollout_steps"]):
            assert s0["buffer_before"] == s1["buffer_before"]
            assert s0["metrics"] == s1["metrics"]  # every ZPPO metric of every step (timings left out)
        assert rank0["log_history"] == rank1["log_history"]

    def test_equal_rows_per_rank_at_every_micro_step(self, grpo_run):
        rank0, rank1 = grpo_run
        for s0, s1 in zip(rank0["rollout_steps"], rank1["rollout_steps"]):
            # every scoring round: the same number of groups on both ranks
            assert [len(r) for r in s0["rounds"]] == [len(r) for r in s1["rounds"]]
            assert [_rows(m) for m in s0["micro_batches"]] == [_rows(m) for m in s1["micro_batches"]]
            # TRL's token-mean divisor of a partition is the partition's token count over both ranks
            assert [m.get("num_items_in_batch") for m in s0["micro_batches"]] == [
                m.get("num_items_in_batch") for m in s1["micro_batches"]
            ]
        # what the training loop consumed, micro-step by micro-step
        assert [_rows(m) for m in rank0["micro_steps"]] == [_rows(m) for m in rank1["micro_steps"]]
        for record in grpo_run:
            assert record["micro_steps"] == [m for s in record["rollout_steps"] for m in s["micro_batches"]]

    def test_odd_replay_split_uses_a_filler_and_padding(self, grpo_run):
        fillers = padding = odd = 0
        for step in range(3):
            replay = [[key for kind, key, _ in _groups(r, step) if kind == "replay"] for r in grpo_run]
            count = len(replay[0]) + len(replay[1])
            assert len(set(replay[0]) | set(replay[1])) == count, "a resident replayed twice in one step"
            assert len(replay[0]) - len(replay[1]) in (0, 1), "replays are dealt round-robin, rank 0 first"
            rank_fillers = [sum(kind == "filler" for kind, _, _ in _groups(r, step)) for r in grpo_run]
            assert rank_fillers == [0, count % 2], "a rank short of a replay group scores exactly one filler"
            odd += count % 2
            fillers += sum(rank_fillers)
            padding += sum(m.get("padding", 0) for r in grpo_run for m in r["rollout_steps"][step]["micro_batches"])
        assert odd and fillers, "no step replayed an odd number of residents: the uneven split was not exercised"
        assert padding, "no partition was padded with zero-weight rows"
        # fillers are never trained: padding rows carry no loss tokens, and real rows are at most the non-filler groups
        for record in grpo_run:
            for step in record["rollout_steps"]:
                real = sum(m["rows"] - m["padding"] for m in step["micro_batches"] if not m["skip"])
                assert real <= G * sum(kind != "filler" for kind, _, _ in step["rounds"][0])

    def test_replayed_count_over_both_ranks(self, grpo_run):
        rank0 = grpo_run[0]
        logged = [h for h in rank0["log_history"] if "zppo/replayed" in h]
        assert len(logged) == 3
        for step, log in enumerate(logged):
            new = sum(kind == "new" for r in grpo_run for kind, _, _ in _groups(r, step))
            assert new == 2 * 3 and log["zppo/new"] == new  # |X_new| counted over both ranks
            buffer = rank0["rollout_steps"][step]["buffer_before"]
            expected = min(int(REPLAY_FRACTION * new), len(buffer))
            assert log["zppo/replayed"] == expected
            replayed = [key for r in grpo_run for kind, key, _ in _groups(r, step) if kind == "replay"]
            assert len(replayed) == expected and set(replayed) <= set(buffer)
        assert any(log["zppo/replayed"] for log in logged)

    def test_parameters_identical_and_skips_change_nothing(self, grpo_run):
        rank0, rank1 = grpo_run
        assert rank0["initial_params"] == rank1["initial_params"]
        assert rank0["params_after_step"] == rank1["params_after_step"]
        assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
        before = [rank0["initial_params"], *rank0["params_after_step"][:-1]]
        for micro, b, a in zip(rank0["micro_steps"], before, rank0["params_after_step"]):
            assert (a == b) == micro["skip"], (
                "an optimizer step must change the parameters exactly when its partition has signal"
            )

    def test_a_signal_to_one_rank_stops_both_at_one_checkpoint_and_the_resume_ends_as_the_straight_run(self, runs):
        # SIGTERM reached rank 1 alone, after update 4 (mid rollout step 2): both ranks agreed at the step's end,
        # finished its updates, wrote checkpoint-6 and returned; nothing finished was lost, and the resumed run's
        # weights, buffer, counters and RNG at update 9 are the uninterrupted run's
        stopped, resumed, straight = runs["grpo-preempted"], runs["grpo-resumed"], runs["grpo"]
        boundary = 2 * STEPS_PER_ROLLOUT
        assert [r["stopped_at"] for r in stopped] == [boundary, boundary]
        assert [r["global_step"] for r in stopped] == [boundary, boundary]
        assert stopped[0]["params_after_step"] == straight[0]["params_after_step"][:boundary]
        assert stopped[0]["final_params"] == stopped[1]["final_params"]
        assert [r["stopped_at"] for r in resumed] == [None, None] and resumed[0][
            "global_step"
        ] == 3 * STEPS_PER_ROLLOUT
        for rank in range(WORLD):
            for key in ("final_params", "residents", "counters", "rng"):
                assert resumed[rank][key] == straight[rank][key], (rank, key)

    def test_a_step_one_rank_s_signal_leaves_is_left_by_both_and_its_start_resumes_as_the_straight_run(self, runs):
        # the signal reached rank 1 before rollout step 2 generated, with no time to finish it (grace 0): both ranks
        # left the step after its plain round, checkpointed update 3 with the state the step started from
        abandoned, resumed, straight = runs["grpo-abandoned"], runs["grpo-abandoned-resumed"], runs["grpo"]
        assert [r["stopped_at"] for r in abandoned] == [STEPS_PER_ROLLOUT] * WORLD
        assert [r["global_step"] for r in abandoned] == [STEPS_PER_ROLLOUT] * WORLD
        assert [len(r["rollout_steps"]) for r in abandoned] == [1, 1]  # the left step is not recorded as done
        for rank in range(WORLD):
            assert resumed[rank]["global_step"] == 3 * STEPS_PER_ROLLOUT
            for key in ("final_params", "residents", "counters", "rng"):
                assert resumed[rank][key] == straight[rank][key], (rank, key)

    # ---------------------------------------------------------------------- ZPPO (BCQ/NCQ, teacher server)

    def test_zppo_decisions_identical_and_reformulations_dealt_over_ranks(self, runs):
        assert [r["student_client"] for r in runs["zppo"]] == ["NoneType", "NoneType"]  # rollouts in the trainer
        check_zppo_run(runs["zppo"])  # the counters too: each rank's shared-prompt savings, summed on every rank
        assert runs["zppo"][0]["counters"]["shared_prompt_tokens_saved_total"] > 0

    # ---------------------------------------------------------------------- rows that train without RL

    @pytest.mark.parametrize("row", ["correction", "on-distill"])
    def test_supervised_and_distillation_rows_step_alike_on_both_ranks(self, runs, row):
        """Correction-SFT's targets and On-Distill's rollouts are dealt over ranks, padded to equal rows, and
        every rank takes the same partitions, skips and optimizer steps."""
        rank0, rank1 = runs[row]
        assert rank0["residents"] == rank1["residents"]
        assert rank0["counters"] == rank1["counters"] and rank0["rng"] == rank1["rng"]
        assert rank0["log_history"] == rank1["log_history"]
        assert [_rows(m) for m in rank0["micro_steps"]] == [_rows(m) for m in rank1["micro_steps"]]
        assert rank0["params_after_step"] == rank1["params_after_step"]
        assert rank0["final_params"] == rank1["final_params"] != rank0["initial_params"]
        trained = [log["zppo/targets_trained"] for log in rank0["log_history"] if "zppo/targets_trained" in log]
        assert trained and sum(trained) > 0


def test_a_two_process_recipe_run_saves_and_exits_cleanly(tiny_text_model_dir, tmp_path):
    # recipes/zppo.py as a user launches it on 2 gloo processes (GRPO†: no teacher), three times: each run saves
    # and every rank exits 0. Freeing the trainer after destroying the process group hung a rank after its last
    # line in about one run in two (zppo_trl.recipe.release_distributed), so three runs catch a regression
    # seven times in eight.
    data = tmp_path / "toy.jsonl"
    write_jsonl(toy_rows("text"), data)
    settings = {
        "model_name_or_path": str(tiny_text_model_dir), "dataset_name": str(data), "augmentations": [],
        "use_judge": False, "use_cpu": True, "bf16": False, "use_vllm": False, "gradient_checkpointing": False,
        "report_to": [], "num_generations": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
        "num_partitions": 2, "max_completion_length": 8, "replay_fraction": 0.5, "max_steps": 2,
        "save_strategy": "no", "logging_steps": 1, "seed": 0, "disable_tqdm": True,
    }  # fmt: skip
    for run in range(3):
        out = tmp_path / f"run{run}"
        config = tmp_path / f"run{run}.yaml"
        config.write_text(yaml.safe_dump({**settings, "output_dir": str(out)}))
        code, output = accelerate(
            REPO_ROOT / "recipes" / "zppo.py", ["--config", str(config)], environment(tmp_path / "hf-home"), 240
        )
        assert code is not None, f"run {run}: a rank did not exit:\n{output[-3000:]}"
        assert code == 0, f"run {run} failed (exit {code}):\n{output[-3000:]}"
        assert f"done: {out}" in output
        assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
