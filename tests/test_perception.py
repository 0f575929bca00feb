"""Perception-R1's visual perception reward (zppo_trl.terms.perception_r1), on hand-computed values and a real judge.

Written out independently of the code: for a rollout of a question with K visual annotations, the judge answers one
<infoK>0|1</infoK> per annotation; r_v = (annotations judged present) / K, an item left out counting as absent; the
row's reward for the advantages is r + 0.7 r_v; the buffer and the plain accuracy read r alone.
"""

from __future__ import annotations

import pytest

from zppo_trl import ZPPOConfig
from zppo_trl.terms.perception_r1 import (
    judge_perception,
    parse_perception_verdicts,
    perception_reward,
    render_perception_judge,
    row_annotations,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
except ImportError:
    from tests.settings import CPU as CPU_ONLY

CPU = CPU_ONLY


def test_verdicts_are_read_per_annotation_the_last_tag_of_each_index_counting():
    reply = "<info1>1</info1> <info2>0</info2>\n<info3> 1 </info3>"
    assert parse_perception_verdicts(reply, 3) == [True, False, True]
    assert perception_reward(parse_perception_verdicts(reply, 3)) == pytest.approx(2 / 3)
    # a fourth annotation the judge left out is absent: 2 of 4, not 2 of the 3 it answered
    assert perception_reward(parse_perception_verdicts(reply, 4)) == pytest.approx(0.5)
    # a judge that corrects itself: the last tag of an index is its verdict; "1.0" is 1
    assert parse_perception_verdicts("<info1>0</info1> wait, <info1>1.0</info1>", 1) == [True]
    # anything but 1 is absent: a word, 0.5, an unclosed tag
    assert parse_perception_verdicts("<info1>yes</info1><info2>0.5</info2><info3>1", 3) == [False, False, False]
    # a reasoning trace is not the verdict: drafts inside it do not count
    assert parse_perception_verdicts("<think><info1>1</info1></think><info1>0</info1>", 1) == [False]
    assert parse_perception_verdicts("no tags at all", 2) == [False, False]
    assert perception_reward([]) == 0.0


def test_the_judge_prompt_numbers_the_annotations_and_carries_the_whole_response():
    prompt = render_perception_judge(["AB is a diameter", "angle C is 30 degrees"], "<think>AB is...</think> 60")
    assert "<info1>AB is a diameter</info1>\n<info2>angle C is 30 degrees</info2>" in prompt
    assert prompt.endswith("Response:\n<think>AB is...</think> 60")  # the reasoning is judged too
    assert prompt.index("<info2>angle") < prompt.index("Response:")
    with pytest.raises(ValueError, match="at least one visual annotation"):
        render_perception_judge([], "x")


def test_annotations_are_a_list_of_strings_and_a_bad_one_names_its_row():
    assert row_annotations(None, "q1") == [] and row_annotations([], "q1") == []
    assert row_annotations([" a circle ", "two chords"], "q1") == ["a circle", "two chords"]
    with pytest.raises(ValueError, match="row 'q7': field 'visual_annotations' must be a list of strings, got str"):
        row_annotations("a circle", "q7")
    with pytest.raises(ValueError, match="row 'q7': field 'visual_annotations' item 1 must be a non-empty string"):
        row_annotations(["a circle", " "], "q7")


class _Judge:
    """Replies by prompt: the first annotation present and the second absent, or no reply (a failed request)."""

    def __init__(self):
        self.calls = []

    def sample(self, prompts, n, max_tokens, temperature, reasoning):
        self.calls.append(
            dict(prompts=prompts, n=n, max_tokens=max_tokens, temperature=temperature, reasoning=reasoning)
        )
        return [[] if "FAIL" in p else ["<info1>1</info1><info2>0</info2>"] for p in prompts]


def test_every_item_is_judged_in_one_batch_at_temperature_zero_and_a_failure_is_none():
    judge = _Judge()
    scores = judge_perception(judge, [(["a", "b"], "ok"), (["a", "b"], "FAIL"), (["a", "b", "c"], "ok")])
    assert scores == [pytest.approx(0.5), None, pytest.approx(1 / 3)]
    (call,) = judge.calls
    assert len(call["prompts"]) == 3 and call["n"] == 1 and call["temperature"] == 0.0 and call["max_tokens"] == 512
    assert call["reasoning"] is False  # the verdict is the reply's content
    assert judge_perception(judge, []) == [] and len(judge.calls) == 1


def test_the_row_is_grpo_dagger_with_the_term_and_needs_a_judge():
    args = ZPPOConfig(
        **CPU, augmentations=[], reward_term="perception_r1", judge_base_url="http://127.0.0.1:1/v1", judge_model="j"
    )
    assert args.variant == "Perception-R1\u2020" and args.perception_reward_weight == 0.7
    with pytest.raises(ValueError, match="reward_term='perception_r1' asks a judge"):
        ZPPOConfig(**CPU, augmentations=[], reward_term="perception_r1")
    with pytest.raises(ValueError, match="is a row on GRPO\u2020's pipeline"):
        ZPPOConfig(
            **CPU,
            reward_term="perception_r1",
            teacher_base_url="http://127.0.0.1:1/v1",
            teacher_model="t",
        )
    with pytest.raises(ValueError, match="perception_reward_weight must be a finite number >= 0.0"):
        ZPPOConfig(**CPU, augmentations=[], reward_term="perception_r1", judge_model="j", perception_reward_weight=-1)


def test_the_rows_recipe_dry_runs_under_its_tables_name_and_says_who_judges():
    from zppo_trl.plan import print_plan
    from zppo_trl.recipe import parse_recipe_args

    script, args, _ = parse_recipe_args(["--config", "recipes/rows/perception_r1_dagger.yaml", "--dry_run"])
    lines: list[str] = []
    print_plan(script, args, lines.append)
    assert lines[0] == "ZPPO dry run: Perception-R1\u2020"
    assert (
        "  reward term: Perception-R1's perception reward (0.7 x the fraction of a question's visual_annotations "
        "stated), judged by Qwen/Qwen3.5-27B-FP8 at http://127.0.0.1:8000/v1"
    ) in lines
    assert "  teacher: none" in lines  # no teacher takes part: the judge alone
