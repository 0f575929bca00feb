"""The paper's diagnostics: the trace-overlap audit (prompt, parser, two-of-three rule, trace file, table) and
the teacher-capability report, on hand-written inputs. The audit against real judge servers and the trainer's
``audit_traces`` switch are in ``test_diagnostics_run.py``."""

from __future__ import annotations

import json

import pytest

from zppo_trl.evaluation.teacher_capability import capability_steps, capability_summary, teacher_capability_main
from zppo_trl.evaluation.trace_audit import (
    MEMORIZATION,
    TRANSFER,
    audit_questions,
    audit_summary,
    flagged,
    parse_memorization_verdict,
    votes_needed,
)
from zppo_trl.group_log import GroupLog, read_group_log
from zppo_trl.prompts import render_memorization_judge
from zppo_trl.trace_log import TraceLog, read_trace_log

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from test_evaluation_judges import figure_text, squeeze
except ImportError:
    from tests.test_evaluation_judges import figure_text, squeeze


def test_the_memorization_prompt_is_the_papers_figure(paper_tex):
    # The figure typesets its bullet lists with itemize and the ASCII "--" as an en dash: undo both, fill the
    # three fields, compare without whitespace (line breaks are not recoverable from a typeset figure).
    tex = paper_tex.replace("\\begin{itemize}[leftmargin=12pt,topsep=1pt,itemsep=1pt]", "")
    tex = tex.replace("\\end{itemize}", "").replace("\\item", "-")
    figure = figure_text(tex, "fig:prompt-judge-memorization").replace("–", "--")
    figure = figure.replace("{{ question }}", "Q").replace("{{ teacher_correct_response }}", "T")
    figure = figure.replace("{{ student_response }}", "S")
    assert squeeze(render_memorization_judge(" Q\n", "T", "S ")) == squeeze(figure)


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ('{"verdict": "memorization"}', MEMORIZATION),
        ('\n{ "verdict" : "transfer" }\n', TRANSFER),
        ('{"verdict": "Memorization"}', None),  # casing
        ('```json\n{"verdict": "transfer"}\n```', None),  # code fence
        ('The student copied. {"verdict": "memorization"}', None),  # prose
        ('{"verdict": "memorization", "why": "same notation"}', None),  # extra key
        ('{"verdict": "transfer", "verdict": "memorization"}', None),  # duplicate key
        ('{"verdict": "correct"}', None),  # the shared judge's vocabulary
        ('["memorization"]', None),
        (None, None),
    ],
)
def test_the_parser_accepts_only_the_two_verdicts(reply, verdict):
    assert parse_memorization_verdict(reply) == verdict


def test_two_of_three_judges_flag_a_rollout():
    m, t = MEMORIZATION, TRANSFER
    assert votes_needed(3) == 2 and votes_needed(2) == 2 and votes_needed(1) == 1 and votes_needed(4) == 3
    assert flagged([m, m, t]) and flagged([t, m, m]) and flagged([m, m, m])
    assert not flagged([m, t, t])  # one of three is not enough (an any-judge rule would flag it)
    assert not flagged([m, None, t])  # an unparsed reply is never a memorization vote
    assert flagged([m, m, None])
    assert not flagged([m, t])  # two judges: both must say memorization
    assert flagged([m]) and not flagged([None])
    with pytest.raises(ValueError):
        votes_needed(0)


def _trace_file(tmp_path):
    log = TraceLog(tmp_path / "audit_traces.jsonl")
    log.references(0, [("q1", "What is 1+1?", "ref one"), ("q2", "What is 2+2?", "ref two")])
    log.references(2, [("q1", "What is 1+1?", "a later candidate")])  # not the fixed reference: dropped
    log.graduations(4, [("q1", "What is 1+1?", ["a", "b", "c"], [1.0, 1.0, 0.0])])
    log.graduations(6, [("q3", "What is 3+3?", ["x", "y"], [1.0, 1.0])])  # graduated, never shown a BCQ
    log.graduations(8, [("q1", "What is 1+1?", ["d", "e", "f"], [1.0, 0.0, 1.0])])  # resumed run: the last counts
    return log.path


def test_the_trace_file_keeps_the_first_reference_and_the_last_graduation(tmp_path):
    path = _trace_file(tmp_path)
    with open(path, "a") as f:
        f.write('{"kind": "graduation", "id": "q9", "rollo')  # a torn last line
    questions = read_trace_log(path)
    assert list(questions) == ["q1", "q3"]  # q2 never graduated
    q1 = questions["q1"]
    assert (q1.reference, q1.reference_step, q1.graduation_step, q1.rollouts) == ("ref one", 0, 8, ["d", "e", "f"])
    assert TraceLog(path).has_reference("q2") and not TraceLog(path).has_reference("q3")
    kept, missing = audit_questions(path)
    assert [q.id for q in kept] == ["q1"] and missing == ["q3"]
    # another run's references held fixed: q3 gets one there
    other = TraceLog(tmp_path / "other.jsonl")
    other.references(0, [("q3", "What is 3+3?", "held ref three"), ("q1", "What is 1+1?", "held ref one")])
    kept, missing = audit_questions(path, other.path)
    assert {q.id: q.reference for q in kept} == {"q1": "held ref one", "q3": "held ref three"} and missing == []


def test_the_group_log_keeps_each_steps_last_line_and_names_a_bad_one(tmp_path):
    log = GroupLog(tmp_path / "run" / "groups.jsonl")
    log.write(1, [("new", "q1", [1.0, 0.0]), ("bcq", "q1", [1, 1])])
    log.write(2, [("replay", "q1", [0.0, 0.0])])
    log.write(2, [("replay", "q1", [1.0, 0.0]), ("ncq", 7, [0.0, 0.0])])  # a resumed run re-did step 2
    with open(log.path, "a") as f:
        f.write('{"step": 3, "groups": [{"kind": "new", "id')  # a torn last line
    steps = read_group_log(log.path)
    assert list(steps) == [1, 2]
    assert steps[1] == [
        {"kind": "new", "id": "q1", "rewards": [1.0, 0.0]},
        {"kind": "bcq", "id": "q1", "rewards": [1.0, 1.0]},
    ]
    assert [(g["kind"], g["id"], g["rewards"]) for g in steps[2]] == [
        ("replay", "q1", [1.0, 0.0]),
        ("ncq", 7, [0.0, 0.0]),
    ]
    with open(log.path, "a") as f:
        f.write('\n{"step": 4, "groups": []}\n')  # the torn line is no longer the last: named
    with pytest.raises(ValueError, match="groups.jsonl:4: not a JSON line"):
        read_group_log(log.path)
    bad = GroupLog(tmp_path / "bad.jsonl")
    bad.write(1, [])
    with open(bad.path, "a") as f:
        f.write('{"step": 2, "groups": [{"kind": "new"}]}\n')  # JSON, but not a group
    with pytest.raises(ValueError, match="bad.jsonl:2 is not a group log line"):
        read_group_log(bad.path)


def test_the_audit_summary_counts_majority_flags(tmp_path):
    kept, missing = audit_questions(_trace_file(tmp_path))
    (q1,) = kept
    m, t = MEMORIZATION, TRANSFER
    labels = {  # rollouts d, e, f of q1
        "A": {"q1/0": m, "q1/1": m, "q1/2": t},
        "B": {"q1/0": m, "q1/1": t, "q1/2": t},
        "C": {"q1/0": t, "q1/1": None, "q1/2": t},
    }
    rows, summary = audit_summary(kept, missing, labels)
    assert rows == [
        {"id": "q1", "graduation_step": 8, "rollouts": 3, "correct": 2, "memorization": {"A": 2, "B": 1, "C": 0},
         "flagged": 1}
    ]  # fmt: skip
    assert summary["flagged"] == 1 and summary["rollouts"] == 3
    assert summary["trace_overlap_rate"] == pytest.approx(1 / 3)
    assert summary["all_judges_agree"] == pytest.approx(1 / 3)  # only rollout 2: t, t, t
    assert summary["per_judge"]["C"] == {"memorization": 0, "transfer": 2, "unparsed": 1, "memorization_rate": 0.0}
    assert summary["paper_protocol"] and summary["questions_without_reference"] == ["q3"]
    _, two = audit_summary(kept, missing, {"A": labels["A"], "B": labels["B"]})
    assert two["flagged"] == 1 and two["votes_needed"] == 2 and not two["paper_protocol"]


METRICS = [
    {"step": 0, "loss": 0.1},  # not a rollout step
    {"step": 2, "variant": "ZPPO (InternVL3.5-2B)", "zppo/hard": 10, "zppo/hard_bcq_possible": 3,
     "zppo/hard_ncq_only": 5, "zppo/teacher_success_rate": 0.5},
    {"step": 4, "zppo/hard": 9, "zppo/hard_bcq_possible": 1, "zppo/hard_ncq_only": 7,
     "zppo/teacher_success_rate": 0.25},
    {"step": 6, "zppo/hard": 6, "zppo/hard_bcq_possible": 0, "zppo/hard_ncq_only": 4,
     "zppo/teacher_success_rate": 0.0},
    {"step": 8, "zppo/hard": 4, "zppo/hard_bcq_possible": 2, "zppo/hard_ncq_only": 2,
     "zppo/teacher_success_rate": 0.5},
]  # fmt: skip


def test_the_teacher_capability_table_is_the_sums_of_the_logged_split(tmp_path, capsys):
    steps = capability_steps(METRICS)
    assert [s.step for s in steps] == [2, 4, 6, 8]
    assert [s.rate for s in steps] == [3 / 8, 1 / 8, 0.0, 0.5]  # solved / (solved + NCQ-only), not / hard
    summary = capability_summary(steps)
    assert summary["run"]["solved"] == 6 and summary["run"]["hard"] == 24
    assert summary["run"]["rate"] == pytest.approx(
        0.25
    )  # 6/24; the mean of the step rates would be 0.25 too, last_3 tells
    assert summary["last_3"]["rate"] == pytest.approx(3 / 16)  # the step-rate mean would be 0.208
    assert summary["run"]["post_cap_rate"] == pytest.approx(0.3125)
    run = tmp_path / "zppo-internvl"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in METRICS))
    assert teacher_capability_main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| zppo-internvl | InternVL3.5-2B | 4 | 6/24 = 25.0% | 18.8% | 31.2% |" in out
    assert "| 4 | 8 | 1 | 12.5% | 25.0% |" in out
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "metrics.jsonl").write_text(json.dumps({"step": 2, "zppo/hard": 3}) + "\n")
    assert teacher_capability_main([str(tmp_path / "grpo")]) == 2
