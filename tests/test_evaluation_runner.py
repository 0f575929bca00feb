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
