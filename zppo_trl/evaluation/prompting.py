r"""The student's evaluation prompt for every setting of the suite: one `EvalRequest` per question.

Source of truth: the paper's "Prompt and judge templates" paragraph (`sec:appendix:benchmarks`)
and `sec:appendix:mismatch`: "For every setting we strip the upstream reasoning- and
answer-format directives (e.g., 'Think step by step' or 'put your final answer within
\boxed{}'). We then append the shared RL closer", and "The evaluation prompt is the original
question and image fields followed by the shared RL closer", candidate-free. So every user turn
here is: the media (images, or video frames), then one text part holding the question (its
directives stripped), its options as lettered lines where the setting has options, and the
closer last, exactly once (`zppo_trl.prompts.compose_prompt` with no candidate block).

Choices the paper leaves open, made here (each also commented where it is made):

* Media first, then text, in one user turn (the training prompt's order "question text and
  image" is about the text block; Qwen-VL chat templates put images before text). Images go in
  column order; MMMU-Pro's ``<image k>`` placeholders stay in the text as references and its
  images are sent first in ``image_1``..``image_7`` order, so the k-th image is ``<image k>``
  (interleaving would split the question mid-sentence for a gain no other setting gets).
* Options are lettered ``A.``, ``B.``, ... one a line after the question, in the dataset's
  order (the letters `scorers.exact_gold` normalises gold to). Options that already carry
  their letters (Video-MME's ``"A. ..."``) are kept as they are; WeMath's single option string
  (``"A: ...; B: ..."``) is split into one line per lettered option.
* GPQA-Diamond's four answer columns are shuffled per (seed, pass, row id) with a SHA-256-seeded
  generator, and the presented order is recorded in the request's row under
  `scorers.PRESENTED_OPTIONS`, which the scorer reads.
* Rows whose question lives only in the image (MMMU-Pro's ``vision`` config, MathVerse's
  Vision-Only version, whose question column is empty) get `IMAGE_ONLY_QUESTION` as their
  text; MMMU-Pro vision rows get no option lines (the screenshot shows them).
* CharXiv: one request for the reasoning question and one per descriptive question; a
  descriptive question's text is `judges.CHARXIV_DESCRIPTIVE_QUESTIONS` of its template id,
  prefixed with the subplot it is about where the row says so (wording ours).
* VMME-S: the subtitles go before the question under the line `SUBTITLES_HEADER` (wording
  ours); a video without a subtitle file gets `NO_SUBTITLES`.
* MultiChallenge: the conversation is sent as the multi-turn history; the closer is appended to
  the final user turn (the paper: every setting gets it), and nothing in the conversation is
  stripped, since its instructions are what the benchmark tests.
* Video frames are sent as JPEG (quality 90): 32 PNG frames of an HD video make a request of
  tens of megabytes, and the server downsizes every frame to ``max_pixels`` anyway.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..prompts import RL_CLOSER, compose_prompt
from ..teacher import image_data_url
from .judges import CHARXIV_DESCRIPTIVE_QUESTIONS
from .media import DEFAULT_MAX_FRAMES, MediaError, load_image, read_subtitles, video_frames
from .scorers import PRESENTED_OPTIONS, _as_list
from .tasks import SUITE, TaskSpec

__all__ = [
    "EvalRequest",
    "build_requests",
    "strip_directives",
    "render_options",
    "DIRECTIVES",
    "GENERIC_DIRECTIVES",
    "IMAGE_ONLY_QUESTION",
    "SUBTITLES_HEADER",
    "NO_SUBTITLES",
]

IMAGE_ONLY_QUESTION = "Answer the question shown in the image."
"""The text of a row whose question and options are rendered inside its image (MMMU-Pro vision,
MathVerse Vision Only): a task statement without any format directive; our wording."""

SUBTITLES_HEADER = "Subtitles of the video:"
"""The line introducing VMME-S subtitles, placed before the question (our wording)."""

NO_SUBTITLES = "(This video has no subtitles.)"
"""What VMME-S says where a video has no subtitle file (some Video-MME videos have none)."""

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_FRAME_JPEG_QUALITY = 90


@dataclass(frozen=True)
class EvalRequest:
    """One student request of the suite and what scoring it needs.

    Attributes:
        part: None, or for CharXiv which question of the row: ``"reasoning"`` or
            ``"descriptive_1"`` .. ``"descriptive_4"``.
        messages: OpenAI chat messages; images as base64 ``image_url`` parts before the text part.
        question: the question text as the student saw it before the closer (directives
            stripped; without the option lines and subtitles), for the shared judge.
        options: the rendered option lines (``"A. ..."``, one a line) for the judge, or None.
        row: the row the scorer must use: a copy of the input row, with
            `scorers.PRESENTED_OPTIONS` set where the options were shuffled (GPQA-D).
    """

    part: str | None
    messages: list[dict]
    question: str
    options: str | None
    row: dict


# ------------------------------------------------------------------ directive stripping

_I = re.IGNORECASE

GENERIC_DIRECTIVES: tuple[re.Pattern, ...] = (
    # "Think step by step" family (the paper's own example; MMMU-Pro / VisualPuzzles CoT prompts).
    re.compile(r"\s*(?:Let's|Let us)\s+think\s+step\s+by\s+step\s*[.!]?", _I),
    re.compile(r"\s*(?:Please\s+)?(?:think|reason)\s+step\s+by\s+step(?:\s+before\s+answering)?\s*[.,!]?", _I),
    # "put your final answer within \boxed{}" (the paper's example; Qwen/DeepSeek math prompts).
    re.compile(r"\s*(?:,?\s*and\s+)?(?:please\s+)?put\s+your\s+final\s+answer\s+within\s+\\boxed\{\}\s*\.?", _I),
    # lmms-eval post-prompts: ai2d/mathvision/VisualPuzzles "Answer (the question) with the option's
    # letter from the given choices directly.", mmmu_pro "Answer with the option letter from the
    # given choices directly.", mmmu_pro qwen3_vl "Answer with the option letter only."
    re.compile(r"\s*Answer(?:\s+the\s+question)?\s+with\s+the\s+option(?:'s)?\s+letter\s+"
               r"(?:from\s+the\s+given\s+choices\s+directly|only)\s*\.?", _I),
    # lmms-eval's short-answer VQA post-prompt (docvqa, infovqa, ...).
    re.compile(r"\s*Answer\s+the\s+question\s+using\s+a\s+single\s+word\s+or\s+phrase\s*\.?", _I),
    # simple-evals / MMMU-Pro CoT / VisualPuzzles CoT answer-line format.
    re.compile(r"\s*The\s+last\s+line\s+of\s+your\s+response\s+should\s+be\s+of\s+the\s+following\s+format:\s*"
               r"'Answer:\s*\$LETTER'\s*\(without\s+quotes\)\s*where\s+LETTER\s+is\s+one\s+of\s+[^.\n]*\.?", _I),
)
"""Directives stripped in every setting except MultiCh (whose instructions are the test)."""

_EG_LIST = r"(?:[A-E](?:,\s*[A-E])*|-?\d+(?:\.\d+)?(?:,\s*-?\d+(?:\.\d+)?)*)"

# Per setting: (pattern, replacement). Each names where the directive comes from.
DIRECTIVES: dict[str, tuple[tuple[re.Pattern, str], ...]] = {
    # XAI/vlmsareblind `prompt` column: the BlindTest prompts end in an answer-format sentence
    # (xai-org/vlmsareblind task notebooks; e.g. "How many times do the blue and red lines touch
    # each other? Answer with a number in curly brackets, e.g., {5}.").
    "VBlind": (
        # "Answer with a number in curly brackets, e.g., {5}.", "Put your answer in curly brackets,
        # e.g., {2}.", "Answer with only the number in numerical format in curly brackets e.g. {3}.",
        # "Please answer with a number in curly brackets e.g., {10}.", subway maps' "... e.g. {3}".
        (re.compile(r"\s*(?:Please\s+)?(?:Answer|Put\s+your\s+answer)\b[^.?!\n]*?\bin\s+curly\s+brackets,?\s*"
                    r"(?:e\.g\.,?|for\s+example,?)\s*\{[^{}\n]*\}\s*\.?", _I), ""),
        # Counting Grid: "Count the number of rows and columns and answer with numbers in curly
        # brackets. For example, rows={5} columns={6}" -> "Count the number of rows and columns."
        (re.compile(r"\s+and\s+answer\s+with\s+numbers\s+in\s+curly\s+brackets\.\s*For\s+example,\s*"
                    r"rows=\{\d+\}\s*columns=\{\d+\}\s*\.?", _I), "."),
        # Counting Grid: "How many rows and columns are in the table? Answer with only the numbers
        # in a pair (row, column), e.g., (5,6)"
        (re.compile(r"\s*Answer\s+with\s+only\s+the\s+numbers\s+in\s+a\s+pair\s+\(row,\s*column\),?\s*"
                    r"e\.g\.,?\s*\(\d+,\s*\d+\)\s*\.?", _I), ""),
        # Olympic Counting: "How many circles are in the image? Answer with only the number in numerical format."
        (re.compile(r"\s*Answer\s+with\s+only\s+the\s+number\s+in\s+numerical\s+format\s*\.?", _I), ""),
        # Touching Circles: "Are the two circles touching each other? Answer with Yes/No."
        (re.compile(r"\s*Answer\s+with\s+Yes\s*/\s*No\s*\.?", _I), ""),
    ),
    # DynaMath/DynaMath_Sample `question`: the generator's queries embed the answer type
    # (DynaMath/DynaMath question generators, e.g. Q01 "What is the period of this function?
    # Answer the question with a floating-point number.").
    "DynaM": (
        (re.compile(r"\s*Answer\s+the\s+question\s+with\s+an?\s+(?:[\w-]+\s+){0,3}?(?:number|integer|value)\s*\.?", _I), ""),
    ),
    # MathVerse: the directives live in `query_wo` / `query_cot` ("Please directly answer the
    # question and provide the correct option letter, e.g., A, B, C, D.\nQuestion: ..."; Vision
    # Only: "According to the question shown in the image, please ..."), not in `question`,
    # which this harness reads; stripped in case a mirror's question column holds a query.
    "MVerse": (
        (re.compile(r"\s*(?:According\s+to\s+the\s+question\s+shown\s+in\s+the\s+image,\s*)?Please\s+"
                    r"(?:directly\s+answer\s+the\s+question|first\s+conduct\s+reasoning,\s*and\s+then\s+answer\s+the\s+question)"
                    rf"\s+and\s+provide\s+the\s+(?:correct\s+option\s+letter|final\s+value),\s*e\.g\.,\s*{_EG_LIST}"
                    r"(?:,\s*at\s+the\s+end)?\s*\.\s*(?:Question:\s*)?", _I), ""),
    ),
    # MathVista: the hint line is in `query` ("Hint: Please answer the question requiring an
    # integer answer and provide the final value, e.g., 1, 2, 3, at the end.\nQuestion: ..."),
    # not in `question`; stripped in case a mirror's question column holds the query.
    "MVista": (
        (re.compile(r"\s*Hint:\s*Please\s+answer\s+the\s+question\s+[^\n]*?at\s+the\s+end\.\s*(?:Question:\s*)?", _I), ""),
    ),
    # BabyVision: lmms-eval babyvision.yaml post_prompt ("Think about the question and give your
    # final answer in \boxed{Answer} format."), should a prepared copy carry it.
    "BabyV": (
        (re.compile(r"\s*(?:Think\s+about\s+the\s+question\s+and\s+)?give\s+your\s+final\s+answer\s+in\s+"
                    r"\\boxed\{Answer\}\s+format\s*\.?", _I), ""),
    ),
    # EmbSpatial-Bench: lmms-eval embspatial pre_prompt ("Note: You only need to respond with A,
    # B, C, D without providing any additional information.").
    "EmbSp": (
        (re.compile(r"\s*Note:\s*You\s+only\s+need\s+to\s+respond\s+with\s+A,\s*B,\s*C,\s*D\s+without\s+"
                    r"providing\s+any\s+additional\s+information\s*\.?", _I), ""),
    ),
    # VisualPuzzles: lmms-eval VisualPuzzles COT_PROMPT's first sentence (the rest is generic).
    "VisP": (
        (re.compile(r"\s*Solve\s+the\s+multiple-choice\s+question\s+and\s+then\s+answer\s+with\s+the\s+option\s+"
                    r"letter\s+from\s+the\s+given\s+choices\s*\.?", _I), ""),
    ),
    # HLE: the official answer-format system prompt (centerforaisafety/hle, run_model_predictions:
    # "Your response should be in the following format:\nExplanation: ...\nAnswer: ...\n
    # Confidence: ..."), should it be prepended to a question.
    "HLE": (
        (re.compile(r"\s*Your\s+response\s+should\s+be\s+in\s+the\s+following\s+format:\s*\n?\s*Explanation:"
                    r"[^\n]*\n\s*(?:Exact\s+)?Answer:[^\n]*\n\s*Confidence:[^\n]*", _I), ""),
    ),
}
"""Per-setting directive patterns (with replacements), applied before `GENERIC_DIRECTIVES`."""

_NO_STRIPPING = frozenset({"MultiCh"})  # its conversations' instructions are what it tests


def strip_directives(spec_name: str, text: str) -> str:
    """``text`` with the upstream answer-format and reasoning directives of `spec_name` removed.

    Applies the setting's `DIRECTIVES`, then `GENERIC_DIRECTIVES` (not for MultiCh, where the
    conversation's instructions are the benchmark's content). Only the directive sentences
    go; a text in which nothing matched is returned unchanged, byte for byte. Where something
    was removed, the whitespace it leaves is tidied (runs of spaces, blank lines at the ends).
    """
    if spec_name not in SUITE:
        raise ValueError(f"unknown setting {spec_name!r}; settings: {', '.join(SUITE)}")
    if spec_name in _NO_STRIPPING or not isinstance(text, str):
        return text
    out = text
    for pattern, replacement in DIRECTIVES.get(spec_name, ()):
        out = pattern.sub(replacement, out)
    for pattern in GENERIC_DIRECTIVES:
        out = pattern.sub("", out)
    if out == text:
        return text
    out = re.sub(r"[ \t]{2,}", " ", out)
    out = re.sub(r"[ \t]+\n", "\n", out)
    out = re.sub(r"\n{3,}", "\n\n", out)
    return out.strip()


# ------------------------------------------------------------------ options

_LETTERED = re.compile(r"\s*\(?([A-Z])\s*[.):]\s*")
_WEMATH_SPLIT = re.compile(r";\s*(?=\(?[A-Z]\s*[.):])")


def _already_lettered(options: Sequence[str]) -> bool:
    """Whether the options are ``A. ..``, ``B. ..`` in order (Video-MME ships them so)."""
    for index, option in enumerate(options):
        match = _LETTERED.match(option)
        if not match or match.group(1) != _LETTERS[index]:
            return False
    return True


def _option_list(spec: TaskSpec, row: Mapping[str, Any]) -> list | str | None:
    """The row's options in display order, a single option string (WeMath), or None."""
    field = spec.options_field
    if field is None:
        return None
    if isinstance(field, tuple):  # one column per option (C-Eval, GPQA)
        values = []
        for column in field:
            value = row.get(column)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise ValueError(f"{spec.name}: row {row.get('_id')!r} has no option column {column!r}")
            values.append(value)
        return values
    raw = row.get(field)
    if raw is None:
        return None
    if isinstance(raw, Mapping):  # MMVU: {"A": ..., "B": ...}
        return {str(key): value for key, value in raw.items()} or None
    if isinstance(raw, str):
        if raw.strip().startswith("["):  # MMMU-Pro stores its options as a list's repr
            parsed = _as_list(raw)
            return parsed or None
        return raw.strip() or None  # WeMath: one string holding every lettered option
    try:
        values = list(raw)
    except TypeError:
        raise ValueError(f"{spec.name}: row {row.get('_id')!r} field {field!r} is not a list of options") from None
    return values or None


def render_options(options: Sequence[Any] | Mapping[str, Any] | str | None) -> str | None:
    """Option lines as the student sees them: ``"A. text"``, one a line, or None for no options.

    A sequence is lettered A, B, ... in its order (the letters `scorers.exact_gold` uses); a
    sequence already lettered in order (``"A. ..."``) is kept verbatim; a mapping is rendered
    with its own keys (MMVU); a string is a single option string (WeMath ``"A: 1; B: 2"``),
    split into one line per lettered option.
    """
    if options is None:
        return None
    if isinstance(options, str):
        parts = [part.strip() for part in _WEMATH_SPLIT.split(options.strip()) if part.strip()]
        return "\n".join(parts) or None
    if isinstance(options, Mapping):
        lines = [f"{key}. {str(value).strip()}" for key, value in options.items()]
        return "\n".join(lines) or None
    texts = [str(option).strip() for option in options]
    if not texts:
        return None
    if len(texts) > len(_LETTERS):
        raise ValueError(f"{len(texts)} options exceed the {len(_LETTERS)} option letters")
    if _already_lettered(texts):
        return "\n".join(texts)
    return "\n".join(f"{_LETTERS[i]}. {text}" for i, text in enumerate(texts))


def _shuffle_seed(seed: int, pass_index: int, row_id: Any) -> int:
    # SHA-256 rather than hash(): the order must not depend on PYTHONHASHSEED or the platform.
    digest = hashlib.sha256(f"{seed}\x1f{pass_index}\x1f{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _shuffled(options: list, seed: int, pass_index: int, row_id: Any) -> list:
    order = list(options)
    random.Random(_shuffle_seed(seed, pass_index, row_id)).shuffle(order)
    return order


# ------------------------------------------------------------------ media parts


def _image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": image_data_url(image)}}


def _frame_part(frame) -> dict:
    buffer = io.BytesIO()
    frame.convert("RGB").save(buffer, format="JPEG", quality=_FRAME_JPEG_QUALITY)
    return {"type": "image_url", "image_url": {"url": image_data_url(buffer.getvalue())}}


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


# Settings whose rows may have no image: HLE's text rows, MathVerse's Text Only version.
_IMAGE_OPTIONAL = frozenset({"HLE", "MVerse"})


def _image_parts(spec: TaskSpec, row: Mapping[str, Any], row_id: Any) -> list[dict]:
    if spec.image_field is None:
        return []
    columns = spec.image_field if isinstance(spec.image_field, tuple) else (spec.image_field,)
    parts = []
    for column in columns:
        value = row.get(column)
        if _empty(value):
            continue
        where = f"{spec.name} row {row_id!r} field {column!r}"
        parts.append(_image_part(load_image(value, where)))
    if not parts and spec.name not in _IMAGE_OPTIONAL:
        raise MediaError(f"{spec.name} row {row_id!r} has no image in {', '.join(map(repr, columns))}")
    return parts


def _video_parts(spec: TaskSpec, row: Mapping[str, Any], row_id: Any, max_frames: int) -> list[dict]:
    path = row.get("_video_path")
    if path is None:
        raise MediaError(f"{spec.name} row {row_id!r}: no video file found for {spec.video_field!r} "
                         f"= {row.get(spec.video_field)!r} ('_video_path' is None)")  # fmt: skip
    try:
        frames = video_frames(path, max_frames)
    except MediaError as err:
        raise MediaError(f"{spec.name} row {row_id!r}: {err}") from None
    return [_frame_part(frame) for frame in frames]


# ------------------------------------------------------------------ questions


def _question(spec: TaskSpec, row: Mapping[str, Any], row_id: Any) -> str:
    """The row's question text, directives stripped; IMAGE_ONLY_QUESTION where the image holds it."""
    field = spec.question_field
    value = row.get(field) if field else None
    if value is None:
        if spec.name == "MMMU-Pro" and row.get("_config") == "vision":
            return IMAGE_ONLY_QUESTION  # the vision config has no question column (upstream)
        raise ValueError(f"{spec.name}: row {row_id!r} has no question field {field!r}")
    if not isinstance(value, str):
        raise ValueError(f"{spec.name}: row {row_id!r} field {field!r} is {type(value).__name__}, not text")
    text = strip_directives(spec.name, value).strip()
    if not text:
        if spec.name in ("MVerse", "MMMU-Pro"):
            return IMAGE_ONLY_QUESTION  # MathVerse Vision Only: the question is drawn in the diagram
        raise ValueError(f"{spec.name}: row {row_id!r} field {field!r} is empty")
    return text


def _charxiv_subplot_prefix(row: Mapping[str, Any]) -> str:
    """Which subplot a CharXiv descriptive question is about, as a sentence lead (our wording)."""
    location = row.get("subplot_loc")
    if isinstance(location, str) and location.strip():
        return f"For {location.strip()}, "
    if isinstance(location, Sequence) and not isinstance(location, str) and len(location) == 2:
        subplot_row, subplot_col = location
    else:
        subplot_row, subplot_col = row.get("subplot_row"), row.get("subplot_col")
    if subplot_row is None or subplot_col is None:
        return ""
    if int(subplot_row) == 0:  # upstream: row 0 means a single plot
        return "For the current plot, "
    return f"For the subplot at row {int(subplot_row)} and column {int(subplot_col)}, "


def _charxiv_questions(spec: TaskSpec, row: Mapping[str, Any], row_id: Any) -> list[tuple[str, str]]:
    """(part, question text) for CharXiv's reasoning question and its four descriptive questions."""
    questions = [("reasoning", _question(spec, row, row_id))]
    for index in range(1, 5):
        field = f"descriptive_q{index}"
        qid = row.get(field)
        try:
            template = CHARXIV_DESCRIPTIVE_QUESTIONS[int(qid)]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"CharXiv: row {row_id!r} field {field!r} is {qid!r}, not a template id 1..19") from None
        # Layout questions (18, 19) are about the whole figure; upstream adds no subplot there.
        prefix = "" if int(qid) in (18, 19) else _charxiv_subplot_prefix(row)
        text = prefix + (template[0].lower() + template[1:] if prefix else template)
        questions.append((f"descriptive_{index}", text))
    return questions


def _text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def _multich_request(spec: TaskSpec, row: Mapping[str, Any], row_id: Any, condition: str | None = None) -> list[EvalRequest]:
    field = spec.question_field
    conversation = row.get(field)
    if conversation is None:
        raise ValueError(f"{spec.name}: row {row_id!r} has no field {field!r}")
    if isinstance(conversation, (str, Mapping)) or not isinstance(conversation, Sequence) or not conversation:
        raise ValueError(f"{spec.name}: row {row_id!r} field {field!r} must be a non-empty list of messages")
    messages = []
    for index, message in enumerate(conversation):
        where = f"{spec.name}: row {row_id!r} field {field!r}[{index}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be a dict with 'role' and 'content'")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"{where} has role {role!r}, not system/user/assistant")
        if not isinstance(content, str):
            raise ValueError(f"{where} has no text 'content'")
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
        raise ValueError(f"{spec.name}: row {row_id!r} field {field!r} must end with a user turn")
    final = messages[-1]["content"]
    messages[-1] = {"role": "user", "content": compose_prompt(final, condition, RL_CLOSER)}
    return [EvalRequest(None, messages, final.strip(), None, dict(row))]


def build_requests(
    spec: TaskSpec | str,
    row: Mapping[str, Any],
    *,
    pass_index: int = 0,
    seed: int = 0,
    max_frames: int = DEFAULT_MAX_FRAMES,
    condition: str | None = None,
) -> list[EvalRequest]:
    """The student requests for one row of one setting: one per question the row carries.

    CharXiv rows carry five (the reasoning question and four descriptive ones, parts
    ``"reasoning"`` and ``"descriptive_1"`` .. ``"descriptive_4"``); every other row one (part
    None). Each user turn is the media (images in column order, or ``max_frames`` video frames
    in time order), then one text part: the question with its upstream directives stripped
    (`strip_directives`), the lettered option lines, and `prompts.RL_CLOSER` last, exactly once.
    GPQA-D's options are shuffled per (``seed``, ``pass_index``, row ``_id``); the order shown
    is in the returned row under `scorers.PRESENTED_OPTIONS`. See the module docstring for
    the choices the paper leaves open. ``condition`` (e.g. ``"<correct>"`` for a Correction-SFT
    checkpoint, the one row the paper evaluates under its training tag) goes before the closer.

    Raises ValueError naming the setting and field for a row without its question (MultiCh:
    ``conversation``) or with malformed options, and `MediaError` (a ValueError) for an image
    or video that is missing or does not decode.
    """
    if isinstance(spec, str):
        if spec not in SUITE:
            raise ValueError(f"unknown setting {spec!r}; settings: {', '.join(SUITE)}")
        spec = SUITE[spec]
    if not isinstance(row, Mapping):
        raise ValueError(f"{spec.name}: a row must be a dict, got {type(row).__name__}")
    row_id = row.get("_id")
    if spec.name == "MultiCh":
        return _multich_request(spec, row, row_id, condition)

    scored_row = dict(row)
    if spec.name == "CharXiv":
        questions = _charxiv_questions(spec, row, row_id)
    else:
        questions = [(None, _question(spec, row, row_id))]

    options = _option_list(spec, row)
    if spec.name == "GPQA-D":
        options = _shuffled(options, seed, pass_index, row_id)
        scored_row[PRESENTED_OPTIONS] = list(options)
    if spec.name == "MMMU-Pro" and row.get("_config") == "vision":
        option_text = None  # the screenshot shows the options; the scorer still reads the column
    else:
        option_text = render_options(options)

    if spec.video_field is not None:
        media = _video_parts(spec, row, row_id, max_frames)
    else:
        media = _image_parts(spec, row, row_id)

    lead = ""
    if spec.subtitles:
        path = row.get("_subtitle_path")
        subtitles = read_subtitles(path).strip() if path is not None else ""
        lead = f"{SUBTITLES_HEADER}\n{subtitles or NO_SUBTITLES}\n\n"

    requests = []
    for part, question in questions:
        body = question if option_text is None else f"{question}\n{option_text}"
        text = compose_prompt(lead + body, condition, RL_CLOSER)
        messages = [{"role": "user", "content": [*media, _text_part(text)]}]
        requests.append(EvalRequest(part, messages, question, option_text, dict(scored_row)))
    return requests
