"""The runner's memory and aggregation, without a server: records as a run writes them."""

from __future__ import annotations

import json

import pytest

from zppo_trl.evaluation.runner import RecordStore, item_key, sampling_extra_body, summarize_setting
from zppo_trl.evaluation.tasks import PAPER_DECODING, SUITE


def _judgment(key: str, score: float, group: str | None = None, parsed: bool | None = None) -> dict:
    return {"kind": "judgment", "key": key, "digest": "d", "score": score, "group": group, "judge_parsed": parsed}


def test_a_partial_last_line_is_cut_off_so_the_next_record_stays_readable(tmp_path):
    path = tmp_path / "AI2D.jsonl"
    whole = json.dumps({"kind": "generation", "key": "p0/test/0", "prompt": "q", "response": "a"}) + "\n"
    path.write_text(whole + '{"kind": "generation", "key": "p0/te')  # killed mid-write
    store = RecordStore(path)
    assert list(store.generations) == ["p0/test/0"]
    store.add({"kind": "generation", "key": "p0/test/1", "prompt": "q", "response": "b"})
    again = RecordStore(path)
    assert list(again.generations) == ["p0/test/0", "p0/test/1"]  # not glued onto the torn line


def test_a_corrupt_middle_line_is_an_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "AI2D.jsonl"
    path.write_text("not json\n" + json.dumps({"kind": "skip", "key": "k", "reason": "r"}) + "\n")
    with pytest.raises(Exception, match=r"AI2D.jsonl:1"):
        RecordStore(path)


def test_skips_are_decided_afresh_each_run_and_later_records_replace_earlier_ones(tmp_path):
    path = tmp_path / "AI2D.jsonl"
    store = RecordStore(path)
    store.add({"kind": "skip", "key": "p0/test/0", "reason": "prompt: unreadable image", "group": None})
    store.add(_judgment("p0/test/1", 0.0))
    store.add(_judgment("p0/test/1", 1.0))
    again = RecordStore(path)
    assert again.skips == {} and again.judgments["p0/test/1"]["score"] == 1.0


def _store(tmp_path, name: str, judgments: list[dict], skips: list[dict] = ()) -> RecordStore:
    store = RecordStore(tmp_path / f"{name}.jsonl")
    for judgment in judgments:
        key = judgment["key"]
        store.add(
            {
                "kind": "generation",
                "key": key,
                "pass": int(key[1]),
                "row_id": key.split("/", 1)[1],
                "part": None,
                "prompt": "q",
                "response": "r",
            }
        )
        store.add(judgment)
    for skip in skips:
        store.add({"kind": "skip", **skip})
    return store


def test_passes_average_to_the_score_with_its_standard_error(tmp_path):
    judgments = [_judgment(item_key(p, f"test/{i}", None), float(i < p + 1)) for p in range(2) for i in range(4)]
    entry, details = summarize_setting(
        SUITE["AI2D"], _store(tmp_path, "AI2D", judgments), passes=2, complete_rows=True
    )
    assert entry["passes"] == [25.0, 50.0] and entry["score"] == 37.5 and entry["stderr"] == 12.5
    assert entry["n"] == 4 and entry["complete"] is True and len(details) == 8
    (tmp_path / "one").mkdir()
    one, _ = summarize_setting(
        SUITE["AI2D"], _store(tmp_path / "one", "AI2D", judgments[:4]), passes=1, complete_rows=True
    )
    assert one["score"] == 25.0 and one["stderr"] is None  # undefined with one pass, never a made-up 0


def test_dynamath_leaves_out_a_seed_with_a_skipped_variant_and_says_so(tmp_path):
    # Seed "a": 9 variants right, 1 skipped (its worst case is unknown); seed "b": 10 right.
    judgments = [_judgment(item_key(0, f"v{v}/a", None), 1.0, "a") for v in range(1, 10)]
    judgments += [_judgment(item_key(0, f"v{v}/b", None), 1.0, "b") for v in range(1, 11)]
    skips = [{"key": item_key(0, "v10/a", None), "reason": "prompt: unreadable image", "group": "a"}]
    entry, _ = summarize_setting(
        SUITE["DynaM"], _store(tmp_path, "DynaM", judgments, skips), passes=1, complete_rows=True
    )
    assert entry["score"] == 100.0 and entry["n"] == 10  # seed b alone
    assert entry["left_out_with_skipped_variants"] == 9 and entry["skipped"] == 1 and entry["complete"] is False


def test_vblind_is_the_mean_of_its_task_accuracies(tmp_path):
    judgments = [_judgment(item_key(0, f"valid/{i}", None), 1.0, "circles") for i in range(3)]
    judgments.append(_judgment(item_key(0, "valid/3", None), 0.0, "lines"))
    entry, _ = summarize_setting(SUITE["VBlind"], _store(tmp_path, "VBlind", judgments), passes=1, complete_rows=True)
    assert entry["score"] == 50.0  # (3/3 + 0/1) / 2, not 3/4


def test_unparsed_judge_replies_are_counted(tmp_path):
    judgments = [
        _judgment(item_key(0, "test/0", None), 0.0, parsed=False),
        _judgment(item_key(0, "test/1", None), 1.0, parsed=True),
    ]
    entry, _ = summarize_setting(SUITE["AI2D"], _store(tmp_path, "AI2D", judgments), passes=1, complete_rows=True)
    assert entry["judge_unparsed"] == 1 and entry["score"] == 50.0


def test_the_paper_sampling_fields_and_their_openai_subset():
    assert sampling_extra_body(PAPER_DECODING) == {
        "top_k": 20,
        "min_p": 0.0,
        "presence_penalty": 1.5,
        "repetition_penalty": 1.0,
    }
    assert sampling_extra_body(PAPER_DECODING, "openai") == {"presence_penalty": 1.5}


def test_charxiv_is_item_accuracy_with_its_two_halves_reported_beside_it(tmp_path):
    # One row: reasoning right, descriptive 1 of 4 right. Item accuracy 2/5; the halves 1 and 1/4.
    parts = ["reasoning", "descriptive_1", "descriptive_2", "descriptive_3", "descriptive_4"]
    judgments = [_judgment(item_key(0, "validation/0", part), float(part in ("reasoning", "descriptive_2")))
                 for part in parts]  # fmt: skip
    entry, _ = summarize_setting(SUITE["CharXiv"], _store(tmp_path, "CharXiv", judgments), passes=1,
                                 complete_rows=True)  # fmt: skip
    assert entry["score"] == 40.0  # the paper's rule, not the mean of the halves (62.5)
    assert entry["official_aggregates"] == {"reasoning": 100.0, "descriptive": 25.0}


def test_official_figures_are_averaged_over_the_passes_that_have_them(tmp_path):
    # Pass 0: reasoning only (1 of 1); pass 1: reasoning 0 of 1, descriptive 1 of 1.
    judgments = [
        _judgment(item_key(0, "validation/0", "reasoning"), 1.0),
        _judgment(item_key(1, "validation/0", "reasoning"), 0.0),
        _judgment(item_key(1, "validation/0", "descriptive_1"), 1.0),
    ]
    entry, _ = summarize_setting(SUITE["CharXiv"], _store(tmp_path, "CharXiv", judgments), passes=2,
                                 complete_rows=True)  # fmt: skip
    assert entry["official_aggregates"] == {"reasoning": 50.0, "descriptive": 100.0}


def test_a_setting_without_official_figures_reports_none(tmp_path):
    judgments = [_judgment(item_key(0, f"test/{i}", None), 1.0) for i in range(2)]
    entry, _ = summarize_setting(SUITE["AI2D"], _store(tmp_path, "AI2D", judgments), passes=1, complete_rows=True)
    assert "official_aggregates" not in entry and "rule_audit" not in entry


def test_rule_audit_counts_only_audits_of_items_the_rule_still_scores_1(tmp_path):
    judgments = [{**_judgment(item_key(0, f"test/{i}", None), 1.0), "det_score": 1.0} for i in range(3)]
    judgments[2]["det_score"] = 0.0  # rescored since its audit: that audit no longer counts
    store = _store(tmp_path, "AI2D", judgments)
    for i, (score, parsed) in enumerate([(0.0, True), (1.0, True), (0.0, True)]):
        store.add({"kind": "audit", "key": item_key(0, f"test/{i}", None), "digest": "a",
                   "judge_score": score, "judge_parsed": parsed})  # fmt: skip
    entry, _ = summarize_setting(SUITE["AI2D"], RecordStore(store.path), passes=1, complete_rows=True)
    assert entry["rule_audit"] == {"checked": 2, "judge_disagrees": 1, "judge_unparsed": 0, "disagree_rate": 0.5}


def test_a_resumed_run_rescores_with_the_current_rule_but_keeps_the_judges_verdict(tmp_path):
    from eval_fixtures import write_fixture

    from zppo_trl.evaluation.data import load_setting
    from zppo_trl.evaluation.prompting import build_requests
    from zppo_trl.evaluation.runner import EvalOptions, _SettingRun, fingerprint

    spec = SUITE["InfoVQA"]  # Det.: no judge, so the digest does not see the verdict
    write_fixture("InfoVQA", tmp_path / "data", rows=1)
    (row,) = load_setting(spec, tmp_path / "data")
    (request,) = build_requests(spec, row)
    key = item_key(0, row["_id"], None)
    gold = row["answers"][0]
    response = f"\\boxed{{{gold}}}"
    store = RecordStore(tmp_path / "InfoVQA.jsonl")
    # A record an older harness wrote: the same response, a stale metric value, no facets.
    store.add({"kind": "judgment", "key": key, "digest": fingerprint(response, None, None), "det_score": 0.25,
               "score": 0.25, "judge_prompt": None, "group": None})  # fmt: skip
    run = _SettingRun(spec, [row], store, student=None, judge=None, options=EvalOptions(passes=1))
    run._score(key, request, response)
    again = RecordStore(store.path).judgments[key]
    assert again["score"] == again["det_score"] == 1.0 and again["facets"] == {}
    lines = store.path.read_text().splitlines()
    run._score(key, request, response)  # nothing new to record: no new line
    assert store.path.read_text().splitlines() == lines


def test_missing_optional_packages_stop_the_run_before_any_request(monkeypatch, tmp_path):
    import dataclasses

    from zppo_trl.evaluation import runner
    from zppo_trl.teacher import TeacherClient

    needy = dataclasses.replace(SUITE["OCR-EN"], missing_packages=lambda: ["zppo_no_such_package>=1"])
    monkeypatch.setitem(runner.SUITE, "OCR-EN", needy)
    unreachable = TeacherClient("http://127.0.0.1:9/v1", "nobody", max_retries=0)
    with pytest.raises(ValueError, match=r"OCR-EN needs zppo_no_such_package>=1.*pip install 'zppo-trl\[eval\]'"):
        runner.run_suite(["OCR-EN"], unreachable, None, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run directory or any request


def test_an_items_facets_and_answered_reach_the_benchmarks_own_figures(tmp_path):
    from zppo_trl.evaluation.runner import EvalOptions, _SettingRun
    from zppo_trl.evaluation.spec import EvalRequest

    spec = SUITE["VMME"]
    rows = [
        {"_id": "test/0", "answer": "A", "duration": "short", "domain": "Sports", "task_type": "Counting"},
        {"_id": "test/1", "answer": "B", "duration": "long", "domain": "Sports", "task_type": "Counting"},
        {"_id": "test/2", "answer": "C", "duration": "long", "domain": "Sports", "task_type": "Counting"},
    ]
    responses = ["\\boxed{A}", "\\boxed{none of them}", "\\boxed{D}"]  # right; no letter found; wrong
    store = RecordStore(tmp_path / "VMME.jsonl")
    run = _SettingRun(spec, rows, store, student=None, judge=None, options=EvalOptions(passes=1))
    for row, response in zip(rows, responses):
        key = item_key(0, row["_id"], None)
        store.add({"kind": "generation", "key": key, "pass": 0, "row_id": row["_id"], "part": None,
                   "prompt": "q", "response": response})  # fmt: skip
        run._score(key, EvalRequest(None, [], "q", None, row), response)
    entry, details = summarize_setting(spec, store, passes=1, complete_rows=True)
    assert entry["score"] == round(100 / 3, 4)  # the paper's rule: every item in the denominator
    figures = entry["official_aggregates"]
    assert figures["answered-only"] == 50.0  # Video-MME's own: the unanswered item left out
    assert figures["short"] == 100.0 and figures["long"] == 0.0 and figures["domain: Sports"] == 50.0
    assert sorted(detail["answered"] for detail in details) == [False, True, True]
