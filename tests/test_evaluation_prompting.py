"""The evaluation prompts (`zppo_trl.evaluation.prompting`) and the media they read (`...media`)."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image, ImageStat

from zppo_trl.evaluation import scorers
from zppo_trl.evaluation.benchmarks.charxiv import CHARXIV_DESCRIPTIVE_QUESTIONS
from zppo_trl.evaluation.media import MediaError, load_image, read_subtitles, video_frames
from zppo_trl.evaluation.prompting import (
    IMAGE_ONLY_QUESTION,
    NO_SUBTITLES,
    SUBTITLES_HEADER,
    EvalRequest,
    build_requests,
    render_options,
    strip_directives,
)
from zppo_trl.evaluation.tasks import SUITE
from zppo_trl.prompts import RL_CLOSER

# ------------------------------------------------------------------ helpers


def _png(colour=(200, 30, 30), size=(8, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _pil(colour=(200, 30, 30)) -> Image.Image:
    return Image.open(io.BytesIO(_png(colour)))


def _write_video(path, frames: int = 40, fps: int = 10, size: int = 32) -> str:
    """An mp4 whose frame k is a flat grey of level 6k, so a decoded frame tells its index."""
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000  # near-lossless on flat frames: the grey level survives
        for k in range(frames):
            pixels = np.full((size, size, 3), 6 * k, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


def _frame_index(image: Image.Image) -> int:
    return round(ImageStat.Stat(image.convert("L")).mean[0] / 6)


def _texts(request: EvalRequest) -> list[str]:
    out = []
    for message in request.messages:
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
        else:
            out += [part["text"] for part in content if part["type"] == "text"]
    return out


def _image_urls(request: EvalRequest) -> list[str]:
    content = request.messages[-1]["content"]
    return [part["image_url"]["url"] for part in content if part["type"] == "image_url"]


_OPTS = ["red", "green", "blue", "yellow"]


def _row(name: str, video: str | None = None, srt: str | None = None) -> dict:
    """One plausible row of setting ``name`` in its upstream schema (columns from tasks.SUITE)."""
    image = _pil()
    base = {"_id": f"{name}/test/0", "_config": None, "_split": "test"}
    rows = {
        "AI2D": {"question": "Which colour is the arrow?", "options": _OPTS, "answer": "2", "image": image},
        "BabyV": {
            "question": "Which panel differs?",
            "options": _OPTS,
            "choiceAns": 1,
            "blankAns": None,
            "ansType": "choice",
            "image": image,
        },
        "CharXiv": {
            "reasoning_q": "Which line peaks first?",
            "reasoning_a": "blue",
            "image": image,
            "reasoning_q_source": 1,
            "reasoning_a_type": 1,
            "descriptive_q1": 1,
            "descriptive_a1": "T",
            "descriptive_q2": 2,
            "descriptive_a2": "x",
            "descriptive_q3": 18,
            "descriptive_a3": "1 by 2",
            "descriptive_q4": 10,
            "descriptive_a4": "3",
        },
        "DynaM": {
            "question": "What is f(2)?",
            "ground_truth": "4",
            "decoded_image": image,
            "id": "7",
            "answer_type": "float",
        },
        "EmbSp": {"question": "What is left of the lamp?", "answer_options": _OPTS, "answer": 3, "image": image},
        "InfoVQA": {"question": "What year is shown?", "answers": ["1999"], "image": image},
        "MVerse": {
            "question": "Find x.\nChoices:\nA:1\nB:2",
            "answer": "B",
            "image": image,
            "problem_version": "Text Dominant",
            "question_type": "multi-choice",
        },
        "MVision": {
            "question": "Which shape is <image1> missing?",
            "options": _OPTS,
            "answer": "C",
            "decoded_image": image,
        },
        "MVista": {
            "question": "Which is largest?",
            "choices": _OPTS,
            "answer": "blue",
            "decoded_image": image,
            "question_type": "multi_choice",
            "answer_type": "text",
            "precision": None,
            "unit": None,
        },
        "MMMU-Pro": {
            "question": "Compare <image 1> and <image 2>.",
            "options": str(_OPTS),
            "answer": "D",
            "image_1": image,
            "image_2": _pil((0, 0, 255)),
            "_config": "standard (4 options)",
        },
        "MM-Vet": {"question": "What is written?", "answer": "hello", "image": image, "capability": ["ocr"]},
        "OCR-EN": {
            "question": "Read the text.",
            "answers": ["HELLO"],
            "image": image,
            "type": "text recognition en",
            "eval": None,
        },
        "OCR-ZH": {
            "question": "图中写了什么？",
            "answers": ["你好"],
            "image": image,
            "type": "cognition VQA cn",
            "eval": None,
        },
        "VisP": {"question": "Which piece fits?", "options": _OPTS, "answer": "A", "image": image},
        "VBlind": {
            "prompt": "How many times do the blue and red lines touch each other? Answer with a number "
            "in curly brackets, e.g., {5}.",
            "groundtruth": "2",
            "image": image,
            "task": "Line Plot Intersections",
        },
        "WeMath": {
            "question": "What is the area?",
            "option": "A. 6; B. 8; C. 12; D. 24",
            "answer": "C",
            "image_path": image,
        },
        "AIME25": {"question": "Find the remainder of 2^10 mod 7.", "answer": "2"},
        "AIME26": {"problem": "Compute 3 + 4.", "answer": 7},
        "CEval": {"question": "1+1=?", "A": "1", "B": "2", "C": "3", "D": "4", "answer": "B"},
        "GPQA-D": {
            "Question": "Which particle is a lepton?",
            "Correct Answer": "electron",
            "Incorrect Answer 1": "proton",
            "Incorrect Answer 2": "neutron",
            "Incorrect Answer 3": "pion",
        },
        "HLE": {"question": "State the constant.", "answer": "42", "image": "", "answer_type": "exactMatch"},
        "IMO-AB": {"Problem": "Find all n such that n^2 = 4, n > 0.", "Short Answer": "2"},
        "MMLU": {"question": "What is H2O?", "choices": ["salt", "water", "air", "fire"], "answer": 1},
        "MMLU-Pro": {"question": "Pick the prime.", "options": ["4", "6", "7", "8", "9"], "answer": "C"},
        "MMLU-Rd": {"question": "Pick the even number.", "choices": ["1", "3", "4", "5"], "answer": 2},
        "MultiCh": {
            "conversation": [
                {"role": "user", "content": "Always answer in French."},
                {"role": "assistant", "content": "D'accord."},
                {"role": "user", "content": "Capital of Italy?"},
            ],
            "pass_criteria": "YES",
            "target_question": "Is the answer in French?",
            "axis": "retention",
        },
        "MMVU": {
            "question": "Which technique is shown?",
            "choices": {"A": "weld", "B": "rivet"},
            "answer": "A",
            "question_type": "multiple-choice",
            "video": "https://x/videos/a.mp4",
        },
        "MVBench": {
            "question": "What happens first?",
            "candidates": ["sit", "stand", "run"],
            "answer": "stand",
            "video": "a.mp4",
        },
        "VMME": {
            "question": "How many people appear?",
            "options": ["A. 1", "B. 2", "C. 3", "D. 4"],
            "answer": "B",
            "videoID": "abc",
        },
        "VMME-S": {
            "question": "How many people appear?",
            "options": ["A. 1", "B. 2", "C. 3", "D. 4"],
            "answer": "B",
            "videoID": "abc",
        },
        "VMMMU": {
            "question": "What is computed?",
            "options": _OPTS,
            "answer": "A",
            "id": "v1",
            "question_type": "multiple-choice",
        },
    }
    row = {**base, **rows[name]}
    if SUITE[name].video_field is not None:
        row["_video_path"] = video
    if SUITE[name].subtitles:
        row["_subtitle_path"] = srt
    return row


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> str:
    return _write_video(tmp_path_factory.mktemp("video") / "count.mp4")


@pytest.fixture(scope="module")
def srt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("subs") / "abc.srt"
    path.write_text(
        "\ufeff1\r\n00:00:00,000 --> 00:00:01,500\r\nHello there.\r\n\r\n"
        "2\r\n00:00:02,000 --> 00:00:03,000\r\nThe 2 of us\r\nwalk on.\r\n\r\n",
        encoding="utf-8",
    )
    return str(path)


# ------------------------------------------------------------------ the closer, per setting


@pytest.mark.parametrize("name", list(SUITE))
def test_closer_is_last_and_appears_once(name, video, srt):
    requests = build_requests(name, _row(name, video, srt), max_frames=4)
    assert requests and all(isinstance(request, EvalRequest) for request in requests)
    for request in requests:
        texts = _texts(request)
        assert sum(text.count(RL_CLOSER) for text in texts) == 1
        last = request.messages[-1]
        assert last["role"] == "user"
        final = last["content"] if isinstance(last["content"], str) else last["content"][-1]["text"]
        assert final.endswith(RL_CLOSER)  # the closer ends the prompt: no candidate block, nothing after it
        assert "<candidate>" not in final
        assert request.question and RL_CLOSER not in request.question
        if not isinstance(last["content"], str):  # media first, one text part last
            kinds = [part["type"] for part in last["content"]]
            assert kinds[-1] == "text" and "text" not in kinds[:-1]


def test_loader_fixture_rows_build_and_gold_letters_grade(tmp_path):
    """Rows as the loader really returns them (tests/eval_fixtures.py): every setting builds its
    requests, and on the deterministic paths a response boxing the gold grades correct."""
    fixtures = pytest.importorskip("eval_fixtures")
    data = pytest.importorskip("zppo_trl.evaluation.data")
    for name, spec in SUITE.items():
        root = fixtures.write_fixture(name, tmp_path / name, rows=1)
        dirs = fixtures.fixture_dirs(root) if spec.video_field else {}
        for row in data.load_setting(spec, source=root, **dirs):
            for request in build_requests(spec, row, max_frames=4):
                assert _texts(request)[-1].endswith(RL_CLOSER), name
                if spec.scoring == "exact+judge":
                    gold = scorers.exact_gold(spec, request.row)
                elif spec.scoring == "rule+judge":
                    gold = scorers.rule_gold(spec, request.row)
                else:
                    continue
                verdict = scorers.score_deterministic(spec, f"<think>.</think> \\boxed{{{gold}}}", request.row)
                assert verdict.score == 1.0, (name, gold, _texts(request)[-1])


# ------------------------------------------------------------------ options


_MC = [
    "AI2D",
    "BabyV",
    "EmbSp",
    "MVision",
    "MMMU-Pro",
    "VisP",
    "WeMath",
    "CEval",
    "GPQA-D",
    "MMLU",
    "MMLU-Pro",
    "MMLU-Rd",
]


@pytest.mark.parametrize("name", _MC)
def test_lettered_options_agree_with_the_scorers_gold(name):
    (request,) = build_requests(name, _row(name), seed=3, pass_index=1)
    gold = scorers.exact_gold(SUITE[name], request.row)
    lines = request.options.splitlines()
    letters = [line.split(".", 1)[0] for line in lines]
    assert letters == list("ABCDEFGHIJ"[: len(lines)])
    assert request.options in _texts(request)[-1]
    right = scorers.score_deterministic(name, f"<think>.</think> \\boxed{{{gold}}}", request.row)
    wrong_letter = next(letter for letter in letters if letter != gold)
    wrong = scorers.score_deterministic(name, f"<think>.</think> \\boxed{{{wrong_letter}}}", request.row)
    assert (right.score, wrong.score) == (1.0, 0.0)


def test_the_gold_letter_names_the_gold_option_text():
    (request,) = build_requests("AI2D", _row("AI2D"))  # answer "2" -> the third option
    assert "C. blue" in request.options.splitlines()
    (request,) = build_requests("GPQA-D", _row("GPQA-D"), seed=0, pass_index=2)
    gold = scorers.exact_gold(SUITE["GPQA-D"], request.row)
    assert f"{gold}. electron" in request.options.splitlines()


def test_option_rendering_keeps_existing_letters_and_splits_wemath():
    assert render_options(["A. 1", "B. 2"]) == "A. 1\nB. 2"  # Video-MME: not "A. A. 1"
    assert render_options(["x", "y"]) == "A. x\nB. y"
    assert render_options({"A": "weld", "B": "rivet"}) == "A. weld\nB. rivet"  # MMVU's dict
    assert render_options("A. 6; B. 8; C. 1;2") == "A. 6\nB. 8\nC. 1;2"  # WeMath; ';' inside an option stays
    assert render_options([]) is None and render_options(None) is None


def test_mmlu_pro_ten_options_and_mmvu_dict(video):
    (request,) = build_requests("MMMU-Pro", {**_row("MMMU-Pro"), "options": str([f"o{i}" for i in range(10)])})
    assert request.options.splitlines()[-1] == "J. o9"
    (request,) = build_requests("MMVU", _row("MMVU", video), max_frames=2)
    assert request.options == "A. weld\nB. rivet"


# ------------------------------------------------------------------ GPQA shuffle


def test_gpqa_shuffle_is_deterministic_per_seed_pass_and_id():
    row = _row("GPQA-D")
    order = lambda **kw: build_requests("GPQA-D", row, **kw)[0].row[scorers.PRESENTED_OPTIONS]  # noqa: E731
    assert order(seed=0, pass_index=0) == order(seed=0, pass_index=0)
    assert sorted(order(seed=0, pass_index=0)) == sorted(["electron", "proton", "neutron", "pion"])
    across_passes = {tuple(order(seed=0, pass_index=p)) for p in range(6)}
    across_seeds = {tuple(order(seed=s, pass_index=0)) for s in range(6)}
    across_ids = {
        tuple(build_requests("GPQA-D", {**row, "_id": f"r{i}"})[0].row[scorers.PRESENTED_OPTIONS]) for i in range(6)
    }
    assert len(across_passes) > 1 and len(across_seeds) > 1 and len(across_ids) > 1
    assert scorers.PRESENTED_OPTIONS not in row  # the input row is not modified
    (request,) = build_requests("GPQA-D", row, pass_index=4)
    shown = [line.split(". ", 1)[1] for line in request.options.splitlines()]
    assert shown == request.row[scorers.PRESENTED_OPTIONS]  # what the student saw is what the scorer reads


def test_gpqa_missing_option_column_is_named():
    row = _row("GPQA-D")
    del row["Incorrect Answer 2"]
    with pytest.raises(ValueError, match="GPQA-D.*'Incorrect Answer 2'"):
        build_requests("GPQA-D", row)


# ------------------------------------------------------------------ CharXiv


def test_charxiv_yields_reasoning_and_four_descriptive_requests():
    requests = build_requests("CharXiv", _row("CharXiv"))
    assert [r.part for r in requests] == ["reasoning"] + [f"descriptive_{i}" for i in range(1, 5)]
    assert requests[0].question == "Which line peaks first?"
    assert [r.question for r in requests[1:]] == [CHARXIV_DESCRIPTIVE_QUESTIONS[q] for q in (1, 2, 18, 10)]
    assert all(len(_image_urls(r)) == 1 for r in requests)


def test_charxiv_descriptive_questions_name_the_subplot():
    row = {**_row("CharXiv"), "subplot_row": 2, "subplot_col": 1}
    requests = build_requests("CharXiv", row)
    assert requests[1].question == "For the subplot at row 2 and column 1, what is the title of the plot?"
    assert requests[3].question == CHARXIV_DESCRIPTIVE_QUESTIONS[18]  # the layout question is about the figure
    single = build_requests("CharXiv", {**row, "subplot_row": 0, "subplot_col": 0})
    assert single[2].question == "For the current plot, what is the label of the x-axis?"


def test_charxiv_bad_template_id_is_named():
    with pytest.raises(ValueError, match="descriptive_q3"):
        build_requests("CharXiv", {**_row("CharXiv"), "descriptive_q3": 42})


# ------------------------------------------------------------------ images


def test_images_become_png_data_urls_in_column_order():
    (request,) = build_requests("MMMU-Pro", _row("MMMU-Pro"))
    urls = _image_urls(request)
    assert len(urls) == 2 and all(url.startswith("data:image/png;base64,") for url in urls)
    colours = [
        Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB").getpixel((0, 0)) for url in urls
    ]
    assert colours == [(200, 30, 30), (0, 0, 255)]  # image_1 then image_2, as <image 1>, <image 2>
    assert "<image 1>" in request.question  # placeholders stay as references


@pytest.mark.parametrize("form", ["pil", "dict", "bytes", "path", "data_url"])
def test_every_image_form_loads(form, tmp_path):
    png = _png((10, 200, 10))
    path = tmp_path / "x.png"
    path.write_bytes(png)
    value = {
        "pil": _pil((10, 200, 10)),
        "dict": {"bytes": None, "path": str(path)},
        "bytes": png,
        "path": str(path),
        "data_url": "data:image/png;base64," + base64.b64encode(png).decode(),
    }[form]
    assert load_image(value, "t").convert("RGB").getpixel((0, 0)) == (10, 200, 10)
    (request,) = build_requests("AI2D", {**_row("AI2D"), "image": value})
    assert len(_image_urls(request)) == 1


def test_hle_text_rows_have_no_image_and_image_rows_have_one():
    (text_only,) = build_requests("HLE", _row("HLE"))
    assert _image_urls(text_only) == []
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    (with_image,) = build_requests("HLE", {**_row("HLE"), "image": data_url})
    assert len(_image_urls(with_image)) == 1


def test_truncated_image_raises_media_error(tmp_path):
    truncated = _png(size=(64, 64))[:-40]
    with pytest.raises(MediaError, match="field 'image'"):
        build_requests("AI2D", {**_row("AI2D"), "image": {"bytes": truncated, "path": None}})
    lazy = Image.open(io.BytesIO(truncated))  # opens fine: PIL decodes lazily
    with pytest.raises(MediaError, match="where-it-was"):
        load_image(lazy, "where-it-was")


@pytest.mark.parametrize("value", [b"not an image", "/no/such/file.png", "https://example.com/a.png", 3, {"x": 1}])
def test_unreadable_images_raise_media_error(value):
    with pytest.raises(MediaError, match="AI2D row 'AI2D/test/0' field 'image'"):
        build_requests("AI2D", {**_row("AI2D"), "image": value})


def test_a_vlm_row_without_its_image_raises():
    with pytest.raises(MediaError, match="AI2D.*no image"):
        build_requests("AI2D", {**_row("AI2D"), "image": None})


# ------------------------------------------------------------------ video


def test_video_frames_sample_segment_centres(video):
    assert [_frame_index(f) for f in video_frames(video, 8)] == [2, 7, 12, 17, 22, 27, 32, 37]
    assert [_frame_index(f) for f in video_frames(video, 4)] == [5, 15, 25, 35]
    assert [_frame_index(f) for f in video_frames(video, 1)] == [20]


def test_video_frames_cap_and_all_frames_when_fewer(video):
    frames = video_frames(video, 32)
    assert len(frames) == 32
    assert [_frame_index(f) for f in frames] == [int(40 * (i + 0.5) / 32) for i in range(32)]  # 0, 1, 3, ..., 39
    assert [_frame_index(f) for f in video_frames(video, 40)] == list(range(40))
    assert [_frame_index(f) for f in video_frames(video, 100)] == list(range(40))
    with pytest.raises(ValueError, match="max_frames"):
        video_frames(video, 0)


def test_video_requests_send_frames_in_time_order(video):
    (request,) = build_requests("VMME", _row("VMME", video), max_frames=4)
    content = request.messages[0]["content"]
    assert [part["type"] for part in content] == ["image_url"] * 4 + ["text"]
    frames = [Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) for url in _image_urls(request)]
    assert _image_urls(request)[0].startswith("data:image/jpeg;base64,")
    assert [_frame_index(f) for f in frames] == [5, 15, 25, 35]


def test_missing_video_raises_media_error(tmp_path):
    with pytest.raises(MediaError, match=r"VMME row .*'videoID'.*'abc'"):
        build_requests("VMME", _row("VMME", None))
    with pytest.raises(MediaError, match="does not exist"):
        build_requests("MVBench", _row("MVBench", str(tmp_path / "gone.mp4")))
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00" * 100)
    with pytest.raises(MediaError, match="broken.mp4"):
        video_frames(broken)


# ------------------------------------------------------------------ subtitles


def test_read_subtitles_drops_cue_numbers_and_timestamps(srt, tmp_path):
    assert read_subtitles(srt) == "Hello there.\nThe 2 of us\nwalk on."
    with pytest.raises(MediaError, match="does not exist"):
        read_subtitles(tmp_path / "none.srt")


def test_subtitles_come_before_the_question_only_with_subtitles(video, srt):
    (with_subs,) = build_requests("VMME-S", _row("VMME-S", video, srt), max_frames=2)
    text = _texts(with_subs)[-1]
    assert text.index(SUBTITLES_HEADER) < text.index("Hello there.") < text.index("How many people appear?")
    assert "Hello there." not in with_subs.question  # the judge gets the question, not the subtitles
    (without,) = build_requests("VMME", _row("VMME", video), max_frames=2)
    assert SUBTITLES_HEADER not in _texts(without)[-1] and "Hello there." not in _texts(without)[-1]
    (no_file,) = build_requests("VMME-S", _row("VMME-S", video, None), max_frames=2)
    assert NO_SUBTITLES in _texts(no_file)[-1]


# ------------------------------------------------------------------ directives

_STRIPPED = [
    # (setting, upstream text, what the student sees)
    (
        "VBlind",
        "How many times do the blue and red lines touch each other? Answer with a number in curly "
        "brackets, e.g., {5}.",
        "How many times do the blue and red lines touch each other?",
    ),
    (
        "VBlind",
        "Count the intersection points where the blue and red lines meet. Put your answer in curly "
        "brackets, e.g., {2}.",
        "Count the intersection points where the blue and red lines meet.",
    ),
    (
        "VBlind",
        "Count total number of squares in the image. Answer with only the number in numerical format in "
        "curly brackets e.g. {3}.",
        "Count total number of squares in the image.",
    ),
    (
        "VBlind",
        "How many squares are in the image? Please answer with a number in curly brackets e.g., {10}.",
        "How many squares are in the image?",
    ),
    (
        "VBlind",
        "How many single-colored paths go from A to C? Answer with a number in curly brackets, e.g., {3}",
        "How many single-colored paths go from A to C?",
    ),
    (
        "VBlind",
        "Count the number of rows and columns and answer with numbers in curly brackets. For example, "
        "rows={5} columns={6}",
        "Count the number of rows and columns.",
    ),
    (
        "VBlind",
        "How many rows and columns are in the table? Answer with only the numbers in a pair (row, column), "
        "e.g., (5,6)",
        "How many rows and columns are in the table?",
    ),
    (
        "VBlind",
        "How many circles are in the image? Answer with only the number in numerical format.",
        "How many circles are in the image?",
    ),
    (
        "VBlind",
        "Are the two circles touching each other? Answer with Yes/No.",
        "Are the two circles touching each other?",
    ),
    (
        "DynaM",
        "What is the period of this function? Answer the question with a floating-point number.",
        "What is the period of this function?",
    ),
    ("DynaM", "How many apples are left? Answer the question with an integer.", "How many apples are left?"),
    (
        "MVerse",
        "Please directly answer the question and provide the correct option letter, e.g., A, B, C, D.\n"
        "Question: Find x.\nChoices:\nA:1\nB:2",
        "Find x.\nChoices:\nA:1\nB:2",
    ),
    (
        "MVerse",
        "Please first conduct reasoning, and then answer the question and provide the final value, e.g., "
        "1, 2.5, 300, at the end.\nQuestion: Find the area.",
        "Find the area.",
    ),
    (
        "MVerse",
        "According to the question shown in the image, please directly answer the question and provide "
        "the correct option letter, e.g., A, B, C, D.",
        "",
    ),
    (
        "MVista",
        "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., "
        "1, 2, 3, at the end.\nQuestion: How many bars?",
        "How many bars?",
    ),
    (
        "BabyV",
        "Which panel differs?\nThink about the question and give your final answer in \\boxed{Answer} format.",
        "Which panel differs?",
    ),
    (
        "EmbSp",
        "Note: You only need to respond with A, B, C, D without providing any additional information.\n"
        "What is left of the lamp?",
        "What is left of the lamp?",
    ),
    (
        "VisP",
        "Which piece fits?\nSolve the multiple-choice question and then answer with the option letter from "
        "the given choices. The last line of your response should be of the following format: 'Answer: "
        "$LETTER' (without quotes) where LETTER is one of options. Think step by step before answering.",
        "Which piece fits?",
    ),
    (
        "HLE",
        "Your response should be in the following format:\nExplanation: {your explanation}\nAnswer: {your "
        "chosen answer}\nConfidence: {your confidence score between 0% and 100% for your answer}\nWhat is 2+2?",
        "What is 2+2?",
    ),
    # generic directives, in any setting
    ("AIME25", "Find the sum. Let's think step by step.", "Find the sum."),
    ("IMO-AB", "Find all n. Please reason step by step, and put your final answer within \\boxed{}.", "Find all n."),
    (
        "MMMU-Pro",
        "Which is bigger?\nAnswer with the option letter from the given choices directly.",
        "Which is bigger?",
    ),
    (
        "AI2D",
        "Which colour is the arrow? Answer with the option's letter from the given choices directly.",
        "Which colour is the arrow?",
    ),
    (
        "MVision",
        "Which shape?\nAnswer the question with the option's letter from the given choices directly.",
        "Which shape?",
    ),
    ("InfoVQA", "What year is shown?\nAnswer the question using a single word or phrase.", "What year is shown?"),
    ("MMLU-Pro", "Pick the prime. Think step by step before answering.", "Pick the prime."),
]


@pytest.mark.parametrize(("name", "text", "expected"), _STRIPPED)
def test_each_directive_is_stripped(name, text, expected):
    assert strip_directives(name, text) == expected


_PLAIN = (
    "As shown in the figure, AB = 3 and angle C = 40°. What is the answer, e.g., the length of AD?\n"
    "Choices:\nA:20°\nB:25°  (step by step construction is shown)"
)


@pytest.mark.parametrize("name", list(SUITE))
def test_a_plain_question_is_unchanged(name):
    assert strip_directives(name, _PLAIN) == _PLAIN


def test_multichallenge_instructions_are_never_stripped():
    text = "Think step by step. Answer with Yes/No."
    assert strip_directives("MultiCh", text) == text
    assert strip_directives("VBlind", text) == ""


def test_strip_directives_rejects_unknown_settings():
    with pytest.raises(ValueError, match="unknown setting 'Nope'"):
        strip_directives("Nope", "x")


def test_the_student_never_sees_the_stripped_directive():
    (request,) = build_requests("VBlind", _row("VBlind"))
    assert "curly brackets" not in _texts(request)[-1]
    assert request.question == "How many times do the blue and red lines touch each other?"
    assert request.row["prompt"].endswith("{5}.")  # the scorer's and judge's row keeps the upstream text


# ------------------------------------------------------------------ question fields


@pytest.mark.parametrize("name", [n for n in SUITE if n != "CharXiv"])
def test_a_row_without_its_question_field_is_named(name, video, srt):
    row = _row(name, video, srt)
    field = SUITE[name].question_field
    del row[field]
    with pytest.raises(ValueError, match=rf"{re.escape(name)}.*{re.escape(repr(field))}"):
        build_requests(name, row, max_frames=1)


def test_mmmu_pro_vision_rows_have_the_image_only_question():
    row = {
        **_row("MMMU-Pro"),
        "question": None,
        "_config": "vision",
        "image": _pil(),
        "image_1": None,
        "image_2": None,
    }
    (request,) = build_requests("MMMU-Pro", row)
    assert request.question == IMAGE_ONLY_QUESTION and request.options is None
    assert _texts(request)[-1] == f"{IMAGE_ONLY_QUESTION}\n\n{RL_CLOSER}"
    assert scorers.exact_gold(SUITE["MMMU-Pro"], request.row) == "D"  # the scorer still reads the options column
    with pytest.raises(ValueError, match="'question'"):  # only the vision config may lack it
        build_requests("MMMU-Pro", {**row, "_config": "standard (4 options)"})


def test_mathverse_vision_only_empty_question():
    (request,) = build_requests("MVerse", {**_row("MVerse"), "question": ""})
    assert request.question == IMAGE_ONLY_QUESTION


def test_multichallenge_history_with_the_closer_on_the_final_user_turn():
    (request,) = build_requests("MultiCh", _row("MultiCh"))
    assert [m["role"] for m in request.messages] == ["user", "assistant", "user"]
    assert request.messages[0]["content"] == "Always answer in French."
    assert request.messages[-1]["content"] == f"Capital of Italy?\n\n{RL_CLOSER}"
    assert request.question == "Capital of Italy?" and request.part is None
    bad = {**_row("MultiCh"), "conversation": _row("MultiCh")["conversation"][:2]}
    with pytest.raises(ValueError, match="MultiCh.*'conversation'.*end with a user turn"):
        build_requests("MultiCh", bad)
    with pytest.raises(ValueError, match=r"'conversation'\[0\].*role"):
        build_requests("MultiCh", {**bad, "conversation": [{"role": "robot", "content": "x"}]})


@pytest.mark.parametrize("name", ["GPQA-D", "MultiCh"])
def test_a_condition_tag_sits_right_before_the_closer(name):
    """Correction-SFT is evaluated under <correct> (the paper's Correction-SFT algorithm): the tag, then the
    closer, last."""
    (plain,) = build_requests(name, _row(name))
    (tagged,) = build_requests(name, _row(name), condition="<correct>")

    def last(request):
        content = request.messages[-1]["content"]
        return content if isinstance(content, str) else content[-1]["text"]

    assert "<correct>" not in last(plain)
    assert last(tagged) == last(plain).replace(f"\n\n{RL_CLOSER}", f"\n\n<correct>\n\n{RL_CLOSER}")
