"""The deterministic half of the harness's scoring paths, and the settings' aggregation rules.

Source of truth: the paper's appendix "Evaluation benchmarks" (`sec:appendix:benchmarks`) and
the "Prompt and judge templates" paragraph. Every setting has one scoring path
(`TaskSpec.scoring`):

* ``exact+judge``: **Exact** is the project's boxed grader (`zppo_trl.rewards.grade`: mathruler
  on the last ``\\boxed{}`` span, then the degree/percent retry).
* ``rule+judge``: **Rule** is the benchmark's own matching rule (MathVista, MVBench, Video-MME,
  Video-MMMU), each re-implemented below from its upstream evaluator, cited where it is defined.
* ``det``: **Det.** is deterministic scoring only: ANLS for InfographicVQA, OCRBench v2's official
  per-task metrics for OCR-EN / OCR-ZH (the structured types' metrics are in
  `zppo_trl.evaluation.ocrbench`).
* ``benchjudge``: no deterministic step (the benchmark's own judge prompt); not scored here.

What the deterministic step sees. The paper: "The shared judge scores free-form answers when the
boxed span does not parse, or when it parses and does not match", and "If a \\boxed{} span
parses but does not match, the judge receives the extracted snippet. If no strict span parses,
it reads the full response." So Rule (like Exact) is applied to the last boxed span, and a
response without a span scores 0 deterministically and goes to the judge whole. The paper is
silent on Det. without a span; we score it 0 as well (the closer demands a box, and the
containment metrics of OCRBench v2 would otherwise reward long reasoning that merely mentions
the answer).

Upstream quirks are kept where they decide a verdict (they are the benchmark's rule); each one is
commented. Scores are fractions in [0, 1]; `aggregate` returns a fraction too.
"""

from __future__ import annotations

import ast
import math
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rewards import extract_boxed, grade
from .tasks import SUITE, TaskSpec

__all__ = [
    "ItemVerdict",
    "ItemRecord",
    "score_deterministic",
    "exact_gold",
    "aggregate",
    "anls",
    "levenshtein",
    "mathvista_rule",
    "mvbench_rule",
    "videomme_rule",
    "videommmu_rule",
    "ocrbench_v2_score",
    "PRESENTED_OPTIONS",
    "OCR_UNIMPLEMENTED",
]

PRESENTED_OPTIONS = "presented_options"
"""Row key the harness sets where it shuffles options at prompt time (GPQA-D): the option texts
in the order the student saw them. It replaces the spec's option columns for gold normalisation."""

_LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class ItemVerdict:
    """The deterministic verdict on one response.

    Attributes:
        extracted: the last ``\\boxed{}`` span, or None where none parsed.
        score: the deterministic score in [0, 1] (binary for Exact and Rule).
        consult_judge: True only when ``score == 0`` and the setting's path has ``+Judge``.
        judge_input: what the shared judge reads: the extracted snippet when a span parsed,
            else the full response; None on ``det`` settings (they have no judge).
        gold: the gold answer the deterministic step compared against, after normalisation
            (e.g. the option letter); for Det. settings, the accepted answers joined by `` | ``.
        group: the row's `TaskSpec.group_field` value (DynaMath seed, BlindTest task), or None.
        rule: which rule/branch scored it (for logs), e.g. ``"mathvista:float"``.
    """

    extracted: str | None
    score: float
    consult_judge: bool
    judge_input: str | None
    gold: str
    group: str | None
    rule: str


@dataclass(frozen=True)
class ItemRecord:
    """One item's final score (after the judge, where it ran) and its group key."""

    score: float
    group: str | None = None


# ------------------------------------------------------------------ row access


def _require(spec: TaskSpec, row: Mapping[str, Any], field: str) -> Any:
    """``row[field]``; ValueError naming the field where it is missing or None."""
    value = row.get(field) if isinstance(row, Mapping) else None
    if value is None:
        raise ValueError(f"{spec.name}: row has no {field!r} (required for scoring)")
    return value


def _gold_field(spec: TaskSpec, row: Mapping[str, Any]) -> Any:
    """The filled answer column: a tuple `answer_field` means alternatives (BabyV's choice/blank)."""
    fields = spec.answer_field if isinstance(spec.answer_field, tuple) else (spec.answer_field,)
    for field in fields:
        value = row.get(field) if isinstance(row, Mapping) else None
        if value is not None and not (isinstance(value, str) and not value.strip()):
            return value
    raise ValueError(f"{spec.name}: row has no {' or '.join(map(repr, fields))} (the gold answer)")


def _strings(value: Any) -> list[str]:
    """Accepted answers as strings: one string, or any sequence of them (list, tuple, array)."""
    if isinstance(value, str):
        return [value]
    try:
        return [str(item) for item in value]
    except TypeError:
        return [str(value)]


def _as_list(value: Any) -> list:
    """A list from a list/tuple, or from the string repr of one (MMMU-Pro stores options as a string)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
        return list(parsed) if isinstance(parsed, (list, tuple)) else []
    return []


def _options(spec: TaskSpec, row: Mapping[str, Any]) -> list | None:
    """The options in display order, or None where the setting/row has none (or they are unparsed text)."""
    if PRESENTED_OPTIONS in row and row[PRESENTED_OPTIONS] is not None:
        return list(row[PRESENTED_OPTIONS])
    if spec.options_field is None:
        return None
    if isinstance(spec.options_field, tuple):  # one column per option (C-Eval, GPQA)
        return [row.get(column) for column in spec.options_field]
    raw = row.get(spec.options_field)
    if raw is None:
        return None
    return _as_list(raw) if not isinstance(raw, str) or raw.strip().startswith("[") else None


# ------------------------------------------------------------------ Exact: gold normalisation

# How each multiple-choice setting stores its gold (upstream schemas): "index" = an option
# index (0-based), "letter" = the option letter, "text" = the correct option's text. The paper
# says nothing on normalisation, so Exact accepts the option LETTER only (never the option
# text): a box holding the text, or "(B)", falls to the judge, which sees the options.
_MC_GOLD = {
    "AI2D": "index",  # upstream: lmms-lab/ai2d answer is the option index
    "BabyV": "index",  # assumption: choiceAns is an index or a letter (both handled); blankAns is verbatim
    "EmbSp": "index",  # assumption: FlagEval/EmbSpatial-Bench answer indexes answer_options
    "MMLU": "index",  # upstream: cais/mmlu answer is the ClassLabel index
    "MMLU-Rd": "index",  # upstream: mmlu-redux answer is the index into choices
    "MVision": "letter",  # upstream: letter when options is non-empty, else a value
    "MMMU-Pro": "letter",
    "VisP": "letter",
    "WeMath": "letter",
    "CEval": "letter",
    "MMLU-Pro": "letter",
    "GPQA-D": "text",  # upstream: "Correct Answer" text; the letter depends on the prompt's shuffle
}


def exact_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    """The gold string Exact compares the boxed answer with.

    Multiple-choice rows (options non-empty) normalise to the option letter: an index maps to
    its letter, a letter (``"b"``, ``"(B)"``, ``"B."``) to its upper case, and for GPQA-D the
    correct text to its position in `PRESENTED_OPTIONS` (required there: the prompt shuffles).
    Other rows keep the gold verbatim (stripped). ValueError names the field on a malformed row.
    """
    form = _MC_GOLD.get(spec.name)
    if spec.name == "BabyV" and row.get("ansType") is not None:  # ansType names the filled column
        blank = not str(row["ansType"]).lower().startswith("choice")
        gold = _require(spec, row, "blankAns" if blank else "choiceAns")
        if blank:
            return str(gold).strip()
    else:
        gold = _gold_field(spec, row)
    if form is None:
        return str(gold).strip()
    if form == "text" and PRESENTED_OPTIONS not in row:
        raise ValueError(f"{spec.name}: row has no {PRESENTED_OPTIONS!r} (the shuffled option order the prompt used)")
    options = _options(spec, row)
    if spec.name == "MVision" and not options:
        return str(gold).strip()  # free-form MathVision row
    count = len(options) if options else len(_LETTERS)  # unparsed option text: any letter is in range
    if form == "text":
        texts = [str(option).strip() for option in options]
        if str(gold).strip() not in texts:
            raise ValueError(f"{spec.name}: the gold answer is not among {PRESENTED_OPTIONS!r}")
        return _LETTERS[texts.index(str(gold).strip())]
    if isinstance(gold, bool):
        raise ValueError(f"{spec.name}: gold answer {gold!r} is not an option")
    text = str(gold).strip()
    if isinstance(gold, int) or (form == "index" and text.isdigit()):
        index = int(text)
        if not 0 <= index < count:
            raise ValueError(f"{spec.name}: gold option index {index} is out of range for {count} options")
        return _LETTERS[index]
    letter = text.strip("().").strip().upper()
    if len(letter) == 1 and letter in _LETTERS[:count]:
        return letter
    raise ValueError(f"{spec.name}: gold answer {gold!r} is neither an option index nor an option letter")


# ------------------------------------------------------------------ distances


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert/delete/substitute, unit costs); O(len(a) * len(b)) time, O(min) memory."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def anls(prediction: str, answers: Iterable[str], threshold: float = 0.5) -> float:
    """ANLS of one prediction: the max over the accepted answers of ``1 - NL`` if ``NL < threshold``, else 0.

    NL is the normalised Levenshtein distance ``lev(a, p) / max(|a|, |p|)`` on lower-cased,
    whitespace-collapsed strings. Definition: Biten et al., "Scene Text Visual Question
    Answering" (ICCV 2019), eq. 1, tau = 0.5, the metric InfographicVQA (Mathew et al., WACV 2022)
    reports. The bound is strict: ``NL == 0.5`` scores 0 (lmms-eval's `lmms_eval/api/metrics.py:anls`
    keeps 0.5 there and divides by the un-normalised lengths; we follow the paper definition).
    """
    pred = " ".join(prediction.strip().lower().split())
    best = 0.0
    for answer in answers:
        gold = " ".join(str(answer).strip().lower().split())
        length = max(len(gold), len(pred))
        if length and abs(len(gold) - len(pred)) / length >= threshold:
            continue  # lev >= the length gap, so NL >= threshold: skip the quadratic step
        distance = levenshtein(gold, pred) / length if length else 0.0
        if distance < threshold:
            best = max(best, 1.0 - distance)
    return best


# ------------------------------------------------------------------ Rule: MathVista


def mathvista_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """MathVista's answer normalisation and equality; returns (correct, branch).

    Follows lupantech/MathVista `evaluation/calculate_score.py` (`normalize_extracted_answer`,
    `safe_equal`, HEAD 53d5258): multi_choice: a ``(X)`` letter is pulled out, a letter in range
    picks its choice, anything else picks the Levenshtein-closest choice (first on ties); integer:
    ``str(int(float(x)))`` (truncates); float: ``str(round(float(x), precision))``; list: ``str(x)``.
    The result must equal the gold string exactly. The free_form text case is unreachable
    upstream (no branch sets the result); we pass the extraction through, as its first version did.
    """
    spec = spec or SUITE["MVista"]
    gold = str(_require(spec, row, "answer"))
    question_type = _require(spec, row, "question_type")
    answer_type = _require(spec, row, "answer_type")
    extraction = extraction.strip()
    if question_type == "multi_choice":
        choices = [str(choice) for choice in _as_list(_require(spec, row, "choices"))]
        if not choices:
            raise ValueError(f"{spec.name}: multi_choice row has no 'choices'")
        letters = re.findall(r"\(([a-zA-Z])\)", extraction)
        if letters:
            extraction = letters[0].upper()
        if extraction in _LETTERS[: len(choices)]:
            prediction = choices[_LETTERS.index(extraction)]
        else:
            distances = [levenshtein(extraction, choice) for choice in choices]
            prediction = choices[distances.index(min(distances))]
        return prediction == gold, "mathvista:multi_choice"
    if answer_type == "integer":
        try:
            prediction = str(int(float(extraction)))
        except (ValueError, OverflowError):
            prediction = None
    elif answer_type == "float":
        try:
            precision = int(float(_require(spec, row, "precision")))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{spec.name}: row 'precision' {row.get('precision')!r} is not a number") from None
        try:
            prediction = str(round(float(extraction), precision))
        except (ValueError, OverflowError):
            prediction = None
    else:  # "list" (str(x) of a string is itself) and free_form "text"
        prediction = extraction
    return prediction == gold, f"mathvista:{answer_type}"


# ------------------------------------------------------------------ Rule: MVBench

# lmms-eval `lmms_eval/tasks/mvbench/utils.py` (`mcq_acc`, unchanged from c7eaef37 to HEAD 75571cf):
# the VQA-style punctuation pass, then the first standalone A-E letter.
_MVB_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_MVB_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")
# Upstream's period pattern is "(?!<=\d)(\.)(?!\d)": the intended look-behind is a look-ahead
# that always passes, so it strips every period not followed by a digit; and it passes re.UNICODE
# positionally as sub()'s count, so at most 32 periods go. Both kept.
_MVB_PERIOD = re.compile(r"\.(?!\d)")
_MVB_OPTION_PREFIX = re.compile(r"([A-E])\.\s*(.+)", re.IGNORECASE)
_MVB_LETTER = re.compile(r"\b([A-E])\b", re.IGNORECASE)


def _mvbench_normalise(text: str) -> str:
    """The answer key MVBench compares: an upper-case A-E letter, else the cleaned lower-cased text."""
    match = _MVB_OPTION_PREFIX.fullmatch(text.strip())  # "B. cat" -> "B"
    if match:
        return match.group(1).upper()
    original = text.replace("\n", " ").replace("\t", " ").strip()
    cleaned = original
    joined = bool(_MVB_COMMA_NUMBER.search(original))
    for mark in _MVB_PUNCT:  # the test reads the original text, the edit the running one (upstream)
        glue = joined or (mark + " " in original or " " + mark in original)
        cleaned = cleaned.replace(mark, "" if glue else " ")
    cleaned = _MVB_PERIOD.sub("", cleaned, count=32)
    cleaned = cleaned.strip("'").strip('"').strip(")").strip("(").strip().lower()
    # Quirk kept: after lower-casing, any standalone a-e word counts, so the article in
    # "a cat, so B" reads as "A".
    letter = _MVB_LETTER.search(cleaned)
    return letter.group(1).upper() if letter else cleaned


def mvbench_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """MVBench's `mcq_acc`: the gold letter is the candidate equal to ``answer``; both sides normalised, then equal."""
    spec = spec or SUITE["MVBench"]
    candidates = [str(candidate) for candidate in _as_list(_require(spec, row, "candidates"))]
    answer = str(_require(spec, row, "answer"))
    if answer not in candidates:
        raise ValueError(f"{spec.name}: row 'answer' {answer!r} is not among 'candidates'")
    gold = _LETTERS[candidates.index(answer)]
    return _mvbench_normalise(extraction) == _mvbench_normalise(gold), "mvbench:mcq_acc"


# ------------------------------------------------------------------ Rule: Video-MME

# lmms-eval `lmms_eval/tasks/videomme/utils.py` (`extract_characters_regex`, as of c7eaef37,
# 2026-01-24; the same rule as Video-MME's own eval script). Upstream's list misses two commas,
# so two entries are concatenations ("...option isThe correct...") that never occur; kept.
# Upstream 9ca4445d (2026-04-11) replaced this with lmms-eval's generic `mcq_extract`; we follow
# the benchmark's own rule.
_VMME_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)


def _videomme_letter(text: str) -> str:
    text = text.strip()
    for prefix in _VMME_PREFIXES:
        text = text.replace(prefix, "")
    # Quirk kept: the first upper-case A-D anywhere wins, so "Answer: D" reads as "A".
    match = re.search(r"[ABCD]", text)
    if match is None:  # covers upstream's "> 10 words and no letter" early exit too
        return ""
    return match.group(0)


def videomme_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """Video-MME: the extracted letter equals the gold letter, case-insensitively (VMME and VMME-S)."""
    spec = spec or SUITE["VMME"]
    gold = str(_require(spec, row, "answer")).strip()
    letter = _videomme_letter(extraction)
    return bool(letter) and letter.lower() == gold.lower(), "videomme:letter"


# ------------------------------------------------------------------ Rule: Video-MMMU

# lmms-eval `lmms_eval/tasks/videommmu/utils.py` as of c7eaef37 (2026-01-24): its
# `parse_multi_choice_response`, `parse_open_response`, `normalize_str`, `eval_open`; the MC parse
# moved unchanged to `_task_utils/mmmu_mcq_utils.py:parse_videommmu_multi_choice_response` in
# 2bb5e985, and 9ca4445d (2026-04-11) replaced it with the generic `mcq_extract` (see Video-MME).


def _videommmu_choice(response: str, options: Sequence[str]) -> str:
    """The MMMU-style option parse: "X." / "X:" first, then "(X)", then "X ", then option text."""
    choices = list(_LETTERS[: len(options)])
    for mark in [",", ".", "!", "?", ";", ":", "'"]:
        response = response.strip(mark)
    padded = f" {response} "
    candidates: list[str] = []
    by_period = by_colon = by_bracket = False
    for choice in choices:
        if f"{choice}." in padded:
            candidates.append(choice)
            by_period = True
    for choice in choices:
        if f"{choice}:" in padded:
            candidates.append(choice)
            by_colon = True
    if not candidates:
        for choice in choices:
            if f"({choice})" in padded:
                candidates.append(choice)
                by_bracket = True
    if not candidates:
        candidates = [choice for choice in choices if f"{choice} " in padded]
    by_text = False
    if not candidates and len(padded.split()) > 5:
        lowered = padded.lower()
        candidates = [choice for choice, text in zip(choices, options) if str(text).lower() in lowered]
        by_text = bool(candidates)
    if not candidates:
        return "No Answer Found."
    if len(candidates) == 1:
        return candidates[0]
    # Several: the one whose marker occurs last (first of equals, as numpy's argmax).
    if by_text:
        positions = [padded.lower().rfind(str(options[choices.index(c)]).lower()) for c in candidates]
    else:
        pattern = "{}." if by_period else "{}:" if by_colon else "({})" if by_bracket else " {} "
        positions = [padded.rfind(pattern.format(c)) for c in candidates]
    return candidates[positions.index(max(positions))]


_NUMBER_COMMAS = re.compile(r"-?\b\d{1,3}(?:,\d{3})+\b")
_NUMBER_SCIENTIFIC = re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d+")
_NUMBER_SIMPLE = re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])")
_KEY_INDICATORS = (
    "could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ", "are ",
    "in total ", "total ", "identify ", "recognize ", "calculated as ", "counted as ",
    "measured as ", "observed as ", "concluded as ", "found to be ", "equals ",
    "determined to be ", "number of ", "value is ", "adds up to ", "have ", "has ",
)  # fmt: skip


def _mmmu_normalise(value: str) -> list:
    """A number becomes [its float rounded to 2 places]; text is lower-cased, a single character padded."""
    value = value.strip()
    try:
        return [round(float(value.replace(",", "")), 2)]
    except ValueError:
        pass
    value = value.lower()
    return [" " + value, value + " "] if len(value) == 1 else [value]


def _videommmu_open_predictions(response: str) -> list:
    """The open-answer parse: the tail after the last key phrase of each line, plus every number in it."""
    text = response.strip().strip(".").lower()
    # Upstream splits on r"\.\s(?=[A-Z])|\n" AFTER lower-casing, so only newlines split; kept.
    lines = text.split("\n")
    keys = []
    for index, line in enumerate(lines):
        indicators = _KEY_INDICATORS + (("=",) if index == len(lines) - 1 else ())
        shortest = None
        for indicator in indicators:
            if indicator in line:
                tail = line.split(indicator)[-1].strip()
                if not shortest or len(tail) < len(shortest):
                    shortest = tail
        if shortest and shortest.strip() not in (":", ",", ".", "!", "?", ";", "'"):
            keys.append(shortest)
    if not keys:
        keys = [text]
    predictions = list(keys)
    for key in keys:
        predictions += _NUMBER_COMMAS.findall(key) + _NUMBER_SCIENTIFIC.findall(key) + _NUMBER_SIMPLE.findall(key)
    return [norm for prediction in predictions for norm in _mmmu_normalise(prediction)]


def videommmu_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """Video-MMMU: multiple-choice rows parse an option letter and need it to equal the gold;
    other rows use MMMU's open-answer match (a gold string inside a parsed key answer, or an
    equal number after rounding to 2 places)."""
    spec = spec or SUITE["VMMMU"]
    golds = _strings(_require(spec, row, "answer"))
    if row.get("question_type") == "multiple-choice":
        options = _as_list(_require(spec, row, "options"))
        if not options:
            raise ValueError(f"{spec.name}: multiple-choice row has empty 'options'")
        if not extraction:
            return False, "videommmu:multiple-choice"
        return _videommmu_choice(extraction, options) in golds, "videommmu:multiple-choice"
    norm_golds = [norm for g in golds for norm in _mmmu_normalise(g)]
    for prediction in _videommmu_open_predictions(extraction):
        if isinstance(prediction, str):
            if any(isinstance(g, str) and g in prediction for g in norm_golds):
                return True, "videommmu:open"
        elif prediction in norm_golds:
            return True, "videommmu:open"
    return False, "videommmu:open"


# ------------------------------------------------------------------ Det.: OCRBench v2

# Yuliang-Liu/MultimodalOCR `OCRBench_v2/eval_scripts/eval.py` (task dispatch), `vqa_metric.py`
# and `IoUscore_metric.py` (HEAD 794c36d); lmms-eval ports them to
# `lmms_eval/tasks/ocrbench_v2/`. The structured types (TEDS, key-value F1, the page-OCR text
# metrics, VQA with position, text spotting) are scored by `zppo_trl.evaluation.ocrbench`.
_OCR_VQA_EN = {
    "APP agent en", "ASCII art classification en", "math QA en", "reasoning VQA en", "science QA en",
    "text recognition en", "document classification en", "cognition VQA en", "diagram QA en",
}  # fmt: skip
_OCR_VQA_CN = {"cognition VQA cn", "reasoning VQA cn"}
_OCR_TEXT = {"text translation cn", "fine-grained text recognition en", "full-page OCR en", "full-page OCR cn"}
OCR_UNIMPLEMENTED: dict[str, str] = {}
"""OCRBench v2 task types `ocrbench_v2_score` raises NotImplementedError on, with the metric they need:
none now (every type of the official `eval.py` is scored)."""


def _ocr_vqa(predict: str, answers: Sequence[str], *, lower: bool, chinese: bool) -> float:
    """`vqa_evaluation` / `vqa_evaluation_case_sensitive` / `cn_vqa_evaluation`: short answers by
    containment, long ones (>= 5 words; >= 4 comma parts in Chinese) by ANLS kept at >= 0.5."""
    def clean(text: str) -> str:
        text = text.strip().replace("\n", " ")  # (upstream strips before \n -> " ")
        text = text.lower() if lower else text
        return text.replace(" ", "") if chinese else text

    pred = clean(predict)
    score = 0.0
    for answer in answers:
        gold = clean(str(answer))
        short = len(gold.split(",")) < 4 if chinese else len(gold.split()) < 5
        if short:
            if gold in pred:
                score = 1.0
        else:
            length = max(len(pred), len(gold))
            if length and 1.0 - abs(len(pred) - len(gold)) / length < 0.5:
                continue  # lev >= the length gap: the similarity cannot reach 0.5
            similarity = 1.0 - (levenshtein(pred, gold) / length if length else 0.0)
            if similarity >= 0.5 and similarity > score:
                score = similarity
    return score


def _ocr_eval_method(row: Mapping[str, Any]) -> str | None:
    method = row.get("eval")
    return None if method is None or str(method).strip() in ("", "None", "none") else str(method)


def _ocr_box(text: str) -> list[int] | None:
    """`extract_coordinates`: the last distinct ``(x1, y1, x2, y2)`` / ``[...]`` with every value in [0, 1000]."""
    found: list[tuple[int, ...]] = []
    for match in re.finditer(r"[\(\[]\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*[\)\]]", text):
        if any(len(v.lstrip("0")) > 4 for v in match.groups()):
            continue  # over 1000 (and int() refuses numbers over 4300 digits)
        coords = tuple(int(v) for v in match.groups())
        if all(0 <= v <= 1000 for v in coords):
            found = [c for c in found if c != coords] + [coords]  # a repeat moves to the end
    return list(found[-1]) if found else None


def _iou(a: Sequence[int], b: Sequence[int]) -> float:
    width = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def _ocrbench():
    """`zppo_trl.evaluation.ocrbench`, imported on first use (its packages are the ``eval`` extra)."""
    try:
        import apted, jieba, lxml, nltk, zss  # noqa: F401, E401  (ocrbench imports them on use)

        from . import ocrbench
    except ImportError as err:
        raise ImportError(f"OCRBench v2's structured task types need the zppo-trl[eval] extra ({err})") from err
    return ocrbench


def ocrbench_v2_score(predict: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[float, str]:
    """OCRBench v2's official per-task metric for one prediction; returns (score, branch).

    Dispatches on ``row["type"]`` (and ``row["eval"]``, ``row["question"]``) as the official
    `eval.py` does; the structured types call `zppo_trl.evaluation.ocrbench` (the ``eval`` extra's
    packages: ImportError naming the extra where they are missing). Scores below 0 that upstream's
    TEDS/STEDS can give a far-off prediction are clamped to 0. NotImplementedError names a task
    type in `OCR_UNIMPLEMENTED` (none at present); ValueError for an unknown type or eval method, a
    malformed row, and the rows upstream marks ``ignore`` (excluded from its averages): a "text
    translation cn" row with an empty answer, a "table parsing en" row without a string question.
    """
    spec = spec or SUITE["OCR-EN"]
    task = str(_require(spec, row, "type"))
    raw = _require(spec, row, "answers")
    answers = _strings(raw)
    if not answers:
        raise ValueError(f"{spec.name}: row 'answers' is empty")
    method = _ocr_eval_method(row)
    if task in _OCR_VQA_EN or task in _OCR_VQA_CN:
        if method == "multiple choice":
            # Only the letters of the prediction, equal to the single gold (str.isalpha counts CJK too).
            return float("".join(c for c in predict if c.isalpha()) == answers[0]), f"ocrbench:{task}:multiple choice"
        if method == "case sensitive":
            return _ocr_vqa(predict, answers, lower=False, chinese=False), f"ocrbench:{task}:case sensitive"
        if method is not None:
            raise ValueError(f"{spec.name}: row 'eval' {method!r} is not an OCRBench v2 method for {task!r}")
        return _ocr_vqa(predict, answers, lower=True, chinese=task in _OCR_VQA_CN), f"ocrbench:{task}"
    if task == "handwritten answer extraction cn":
        if "简答" in str(row.get("question", "")):  # short-answer questions: the page-OCR text score
            if not answers[0]:
                raise ValueError(f"{spec.name}: {task!r} 简答 row has an empty answer")
            return _ocrbench().ocr_text_score(predict, answers[0]), f"ocrbench:{task}:简答"
        gold = answers[0]
        if len(gold) > 1:  # the characters joined by any of the listed separators
            joins = ("", ".", ". ", ",", ", ", "、", ";", "; ", " ", "和")
            return float(any(sep.join(gold) in predict for sep in joins)), f"ocrbench:{task}"
        return float(gold in predict), f"ocrbench:{task}"
    if task in ("formula recognition en", "formula recognition cn"):
        if task.endswith("cn"):
            if predict.strip().lower() == "nan":  # upstream's is_nan_value
                return 0.0, f"ocrbench:{task}"
            answers = [re.sub(r"\\text\{([^{}]*)\}", r"\1", answers[0])]
            predict = re.sub(r"\\text\{([^{}]*)\}", r"\1", predict)
        squash = lambda s: s.strip().replace("\n", " ").replace(" ", "")  # noqa: E731
        return float(any(squash(a) in squash(predict) for a in answers)), f"ocrbench:{task}"
    if task == "text counting en":
        if method not in ("exact match", "regression"):
            raise ValueError(f"{spec.name}: row 'eval' {method!r} is not a counting method")
        best = 0.0
        for answer in answers:
            gold = answer.lower().strip().replace("\n", " ")
            if method == "exact match":
                score = float(gold in predict)  # upstream tests the raw prediction here
            else:
                number = re.search(r"\d+", predict.lower().strip().replace("\n", " "))
                try:
                    target = int(gold)
                except ValueError:
                    raise ValueError(f"{spec.name}: regression gold {answer!r} in 'answers' is not an integer") from None
                digits = number.group().lstrip("0") if number else ""  # no number, or 0: score 0
                score = 0.0
                # Longer than 2 * target means out of range (and int() refuses > 4300 digits).
                if digits and len(digits) <= len(str(2 * target)) and 0 < int(digits) < 2 * target:
                    ratio = 1 - abs(int(digits) - target) / target
                    score = ratio if ratio > 0.5 else 0.0
            best = max(best, score)
        return best, f"ocrbench:{task}:{method}"
    if task == "text grounding en":
        try:
            gold_box = [int(v) for v in raw]
        except (TypeError, ValueError):
            gold_box = []
        if len(gold_box) != 4:
            raise ValueError(f"{spec.name}: grounding row 'answers' must be 4 integer coordinates, got {raw!r}")
        box = _ocr_box(predict)
        return (_iou(box, gold_box) if box else 0.0), f"ocrbench:{task}"
    if task in ("table parsing en", "table parsing cn"):
        if len(answers) != 1:  # upstream: raise ValueError
            raise ValueError(f"{spec.name}: {task!r} row needs exactly one answer, got {len(answers)}")
        ob = _ocrbench()
        if task.endswith("cn"):
            return max(0.0, ob.table_html_score(predict, answers[0])), f"ocrbench:{task}"
        question = row.get("question")
        if not isinstance(question, str):
            raise ValueError(f"{spec.name}: {task!r} row has no string 'question' (upstream ignores the item)")
        if "html" in question.lower():
            return max(0.0, ob.table_html_score(predict, answers[0])), f"ocrbench:{task}:html"
        if "markdown" in question.lower():
            return max(0.0, ob.table_markdown_score(predict, answers[0])), f"ocrbench:{task}:markdown"
        raise ValueError(f"{spec.name}: {task!r} question names neither html nor markdown (upstream scores nothing)")
    if task == "chart parsing en":
        gold = raw[0] if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], Mapping) else answers[0]
        return max(0.0, _ocrbench().chart_score(predict, gold)), f"ocrbench:{task}"
    if task in ("document parsing en", "document parsing cn"):
        if len(answers) != 1:  # upstream: assert
            raise ValueError(f"{spec.name}: {task!r} row needs exactly one answer, got {len(answers)}")
        return max(0.0, _ocrbench().document_steds(predict, answers[0])), f"ocrbench:{task}"
    if task in ("key information extraction en", "key information mapping en", "key information extraction cn"):
        if len(answers) != 1:  # upstream: assert
            raise ValueError(f"{spec.name}: {task!r} row needs exactly one answer, got {len(answers)}")
        ob = _ocrbench()
        if task.endswith("cn"):  # upstream: literal_eval, every value a list, then the combinations
            try:
                gold = ast.literal_eval(answers[0])
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                gold = None
            if not isinstance(gold, dict):
                raise ValueError(f"{spec.name}: {task!r} answer is not a dict literal: {answers[0][:80]!r}")
            golds = ob.kie_combinations({k: v if isinstance(v, list) else [v] for k, v in gold.items()})
        else:
            golds = ob.kie_combinations(answers[0])
        return ob.kie_score(predict, golds), f"ocrbench:{task}"
    if task == "VQA with position en":
        box = _require(spec, row, "bbox")
        try:
            gold_box = [int(v) for v in box]
        except (TypeError, ValueError):
            gold_box = []
        if len(gold_box) != 4:
            raise ValueError(f"{spec.name}: {task!r} row 'bbox' must be 4 integer coordinates, got {box!r}")
        return _ocrbench().vqa_with_position(predict, answers, gold_box), f"ocrbench:{task}"
    if task in _OCR_TEXT:
        gold = answers[0]
        if task == "text translation cn" and not gold:
            raise ValueError(f"{spec.name}: {task!r} row has an empty answer (upstream ignores the item)")
        if task == "full-page OCR cn" and not gold:  # upstream adds F-measure None and fails
            raise ValueError(f"{spec.name}: {task!r} row has an empty answer")
        if not predict:  # every one of these branches scores an empty prediction 0 first
            return 0.0, f"ocrbench:{task}"
        return _ocrbench().ocr_text_score(predict, gold), f"ocrbench:{task}"
    if task == "text spotting en":
        boxes = row.get("bbox_list")  # the Hugging Face copy moves spotting boxes to bbox_list
        if boxes is None or len(boxes) == 0:
            boxes = row.get("bbox")
        texts = row.get("content")
        if boxes is None or texts is None:
            raise ValueError(f"{spec.name}: {task!r} row needs gold boxes ('bbox_list' or 'bbox') and texts ('content')")
        ob = _ocrbench()  # no gold box or text: the protocol scores 0, as upstream
        predicted = ob.spotting_boxes(predict)
        return (ob.spotting(predicted, boxes, [str(t) for t in texts]) if predicted else 0.0), f"ocrbench:{task}"
    if task in OCR_UNIMPLEMENTED:
        raise NotImplementedError(f"OCRBench v2 task type {task!r} ({OCR_UNIMPLEMENTED[task]}) is not implemented")
    raise ValueError(f"{spec.name}: row 'type' {task!r} is not an OCRBench v2 task type")


# ------------------------------------------------------------------ the entry point

_RULES: dict[str, Callable[[str, Mapping[str, Any], TaskSpec], tuple[bool, str]]] = {
    "MVista": mathvista_rule,
    "MVBench": mvbench_rule,
    "VMME": videomme_rule,
    "VMME-S": videomme_rule,
    "VMMMU": videommmu_rule,
}


def _rule_gold(spec: TaskSpec, row: Mapping[str, Any]) -> str:
    if spec.name == "MVBench":
        candidates = [str(c) for c in _as_list(_require(spec, row, "candidates"))]
        answer = str(_require(spec, row, "answer"))
        return _LETTERS[candidates.index(answer)] if answer in candidates else answer
    return str(_require(spec, row, "answer"))


def score_deterministic(
    spec: TaskSpec | str,
    response: str | None,
    row: Mapping[str, Any],
    *,
    grader: Callable[[str, str], bool] = grade,
) -> ItemVerdict:
    """Score one response on its setting's deterministic path (Exact, Rule or Det.).

    Args:
        spec: the setting (a `TaskSpec` or its name in `SUITE`).
        response: the student's full response; None or any string (never raises on it).
        row: the dataset row (its upstream columns; plus `PRESENTED_OPTIONS` for GPQA-D).
        grader: the Exact grader, ``(response, gold) -> bool`` (default `zppo_trl.rewards.grade`).

    Returns the `ItemVerdict`. ValueError on a malformed row (naming the missing field) and on
    ``benchjudge`` settings, which have no deterministic step; NotImplementedError on OCRBench v2
    task types this module does not implement.
    """
    if isinstance(spec, str):
        spec = SUITE[spec]
    if spec.scoring == "benchjudge":
        raise ValueError(f"{spec.name} is scored by its benchmark judge alone; it has no deterministic step")
    text = response if isinstance(response, str) else ""
    group = None
    if spec.group_field is not None:
        group = str(_require(spec, row, spec.group_field))
    extracted = extract_boxed(text)

    if spec.scoring == "exact+judge":
        gold = exact_gold(spec, row)
        score, rule = (1.0 if grader(text, gold) else 0.0), "exact"
    elif spec.scoring == "rule+judge":
        gold = _rule_gold(spec, row)
        rule_fn = _RULES[spec.name]
        if extracted is None:
            rule_fn("", row, spec)  # still validates the row
            score, rule = 0.0, "rule:no-span"
        else:
            ok, rule = rule_fn(extracted, row, spec)
            score = 1.0 if ok else 0.0
    else:  # det
        if spec.name == "InfoVQA":
            answers = _strings(_require(spec, row, "answers"))
            if not answers:
                raise ValueError(f"{spec.name}: row 'answers' is empty")
            gold = " | ".join(answers)
            score, rule = (anls(extracted, answers) if extracted is not None else 0.0), "anls"
        else:
            gold = " | ".join(_strings(_require(spec, row, "answers")))
            score, rule = ocrbench_v2_score(extracted if extracted is not None else "", row, spec)
            if extracted is None:
                score, rule = 0.0, "det:no-span"
        return ItemVerdict(extracted, float(score), False, None, gold, group, rule)

    consult = score == 0.0
    judge_input = extracted if extracted is not None else text
    return ItemVerdict(extracted, score, consult, judge_input, gold, group, rule)


# ------------------------------------------------------------------ aggregation


def _record(item: Any) -> tuple[float, str | None]:
    if isinstance(item, Mapping):
        return float(item["score"]), item.get("group")
    return float(item.score), getattr(item, "group", None)


def aggregate(spec: TaskSpec | str, items: Iterable[ItemRecord | ItemVerdict | Mapping[str, Any]]) -> float:
    """A setting's score in [0, 1] from its items' final scores (judge verdicts included).

    ``mean``: item accuracy. ``graded``: the mean of MM-Vet's [0, 1] grades. ``worst_case_variants``
    (DynaMath): a group (seed) counts 1 only when every one of its items (variants) scores 1; the
    mean over groups. Run it per evaluation pass. ``mean_of_tasks`` (VBlind): the mean over groups
    (the 7 BlindTest tasks) of each group's accuracy. Items are `ItemRecord`, `ItemVerdict` or
    mappings with ``score`` and ``group``. ValueError on no items, a score outside [0, 1], or a
    missing group key where the rule needs one.
    """
    if isinstance(spec, str):
        spec = SUITE[spec]
    records = [_record(item) for item in items]
    if not records:
        raise ValueError(f"{spec.name}: no item scores to aggregate")
    for score, _ in records:
        if not 0.0 <= score <= 1.0 or math.isnan(score):
            raise ValueError(f"{spec.name}: item score {score!r} is outside [0, 1]")
    if spec.aggregation in ("mean", "graded"):
        return sum(score for score, _ in records) / len(records)
    groups: dict[str, list[float]] = {}
    for score, group in records:
        if group is None:
            raise ValueError(f"{spec.name}: {spec.aggregation} needs each item's {spec.group_field!r} group key")
        groups.setdefault(str(group), []).append(score)
    if spec.aggregation == "worst_case_variants":
        return sum(all(score == 1.0 for score in scores) for scores in groups.values()) / len(groups)
    if spec.aggregation == "mean_of_tasks":
        return sum(sum(scores) / len(scores) for scores in groups.values()) / len(groups)
    raise ValueError(f"{spec.name}: unknown aggregation {spec.aggregation!r}")
