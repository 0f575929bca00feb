"""`Rounds` and what TRL's hooks do with the round in flight, without a trainer: the generation and scoring are a
function the round is given (here one that fills the request as TRL's scoring hook does), so the round's own work is
what is checked: unscored groups left out and counted, prompt lengths against the context, targets padded to whole
groups and cut at the completion limit; and the Prefix and target handling of each hook."""

import torch
from accelerate import Accelerator

from zppo_trl.augmentations import BuiltGroup, BuiltGroups
from zppo_trl.questions import Questions
from zppo_trl.ranks import Ranks
from zppo_trl.rollout import FILLER, Group, RoundRequest
from zppo_trl.rounds import (
    Rounds,
    cut_to_budget,
    hand_back,
    prompts_with_prefixes,
    responses_with_prefixes,
    token_types,
)
from zppo_trl.step_records import StepRecorder

G = 2
ROWS = {"q1": {"id": "q1", "question": "one"}, "q2": {"id": "q2", "question": "two"}}


class _Format:
    def prompt(self, row, block, closer):
        return " ".join(x for x in (row["question"], block, closer) if x)


class _Tokenizer:
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(word) for word in text.split()]}


def _rounds(rewards, prompt_len=3, context=None, on_server=False):
    """A Rounds whose generation returns ``prompt_len``-token prompts and scores every row with ``rewards``."""
    seen = []

    def generate_and_score(rows, request):
        seen.append((rows, request))
        n = len(rows)
        request.rewards = torch.tensor(rewards[:n], dtype=torch.float64)
        request.texts = [f"reply {i}" for i in range(n)]
        completion = [list(r) for r in request.given_responses] if request.given_responses else [[1, 2]] * n
        width = max(len(c) for c in completion)
        return {
            "prompt_ids": torch.ones(n, prompt_len, dtype=torch.long),
            "prompt_mask": torch.ones(n, prompt_len, dtype=torch.long),
            "completion_ids": torch.tensor([c + [0] * (width - len(c)) for c in completion]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completion]),
            "advantages": torch.zeros(n),
        }

    ranks, counters = Ranks(Accelerator(cpu=True)), {"unscorable_total": 0}
    recorder = StepRecorder(
        ranks=ranks, group_size=G, num_partitions=1, main_process=True, state=None, trl_metrics={}, trl_logs={},
        clients={}, kinds=(), questions=None, reward_signal=None,
    )  # fmt: skip
    recorder.begin(global_step=0)
    rounds = Rounds(
        generate_and_score,
        questions=Questions({0: ROWS["q1"], 1: ROWS["q2"]}, {"q1": 0, "q2": 1}, _Format(), "CLOSE"),
        ranks=ranks,
        group_size=G,
        recorder=recorder,
        counters=counters,
        tokenizer=_Tokenizer(),
        eos_token_id=9,
        max_completion_length=4,
        context=context,
        on_server=on_server,
        defers_old_logps=True,
        token_types=lambda ids: torch.zeros_like(ids),
    )
    return rounds, seen, recorder.metrics, counters


def test_a_group_with_an_unscored_rollout_becomes_a_filler_and_is_counted():
    rounds, seen, metrics, counters = _rounds([1.0, float("nan"), 0.0, 1.0])
    played = rounds.play([Group("new", ROWS["q1"], "BLOCK"), Group("new", ROWS["q2"])], "plain")
    ((rows, request),) = seen
    assert [r["prompt"] for r in rows] == ["one BLOCK CLOSE"] * G + ["two CLOSE"] * G and not request.old_logps
    assert played.groups_per_rank == [[(FILLER, "q1"), ("new", "q2")]]
    assert played.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]  # the NaN is no reward, and its group trains nothing
    assert metrics["unscored_groups"] == 1 and counters["unscorable_total"] == 1
    assert "time/plain_generation_s" in metrics and metrics["plain_prompt_tokens_max"] == 3


def test_prompts_leaving_too_little_context_are_counted():
    rounds, _, metrics, _ = _rounds([0.0] * 4, prompt_len=3, context=6, on_server=True)
    rounds.play([Group("new", ROWS["q1"]), Group("new", ROWS["q2"])], "plain")
    assert metrics["prompts_over_context"] == 2 and metrics["prompts_beyond_context"] == 0
    rounds, _, metrics, _ = _rounds([0.0] * 4, prompt_len=6, context=6, on_server=True)
    rounds.play([Group("new", ROWS["q1"]), Group("new", ROWS["q2"])], "plain")
    assert metrics["prompts_beyond_context"] == 2


def test_targets_are_padded_to_whole_groups_and_cut_at_the_limit():
    rounds, seen, metrics, _ = _rounds([0.0] * 4)
    built = BuiltGroups(groups=[BuiltGroup("correction", "q2", target="aa bbb cccc dd e")])
    played = rounds.targets(built, ROWS["q1"])
    ((rows, request),) = seen
    assert request.given_responses == [[2, 3, 4, 2], [9]]  # cut at 4 tokens without EOS; a filler's bare EOS
    assert played.groups_per_rank == [[("correction", "q2"), (FILLER, "q1")]] and metrics["targets_cut"] == 1
    assert rounds.augmented(BuiltGroups(), 0, ROWS["q1"]).batch is None  # no rank built anything: no round


def test_the_hooks_extend_prompts_with_prefixes_and_cut_continuations_to_what_is_left():
    request = RoundRequest(response_prefixes=[(7, 8), None])
    ids, fields = prompts_with_prefixes([[1], [2]], {"mm_token_type_ids": [[0], [0]]}, request)
    assert ids == [[1, 7, 8], [2]] and fields["mm_token_type_ids"] == [[0, 0, 0], [0]]
    assert cut_to_budget([[1, 2, 3], [1, 2, 3]], [[0.1] * 3] * 2, request, 3) == ([[1], [1, 2, 3]], [[0.1], [0.1] * 3])
    assert cut_to_budget([[1, 2, 3]], None, None, 1) == ([[1, 2, 3]], None)  # no request: as TRL
    decoded = responses_with_prefixes(["x", "y"], [[5], [6]], request, lambda ids: "-".join(map(str, ids)))
    assert decoded == ["7-8-5", "y"]


def test_hand_back_weights_rewards_and_keeps_unscored_rows_nan():
    request = RoundRequest()
    per_func = torch.tensor([[1.0, 0.0], [float("nan"), float("nan")], [float("nan"), 1.0]])
    hand_back(request, per_func, torch.tensor([1.0, 0.5]), ["a", [{"role": "assistant", "content": "b"}], "c"])
    assert request.rewards[0] == 1.0 and torch.isnan(request.rewards[1]) and request.rewards[2] == 0.5
    assert request.texts == ["a", "b", "c"]


def test_token_types_mark_image_and_video_placeholders():
    assert token_types(torch.tensor([[3, 4, 5]]), 4, 5).tolist() == [[0, 1, 2]]
