"""The dataset schema the trainer consumes, and its row validation.

One row is one training question: the image(s), the question text (no closer: the
trainer appends the RL closer), the reference answer the reward grader scores against,
and where the row came from. The ZPPO-77K builder (`zppo_trl.corpus`) writes exactly
these columns; recipes and the trainer read them.
"""

from __future__ import annotations

import ast
import json
import logging
import operator
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ANSWER",
    "COLUMNS",
    "DatasetError",
    "ID",
    "IMAGES",
    "QUESTION",
    "SOURCE",
    "SUBDATASET",
    "demo_questions",
    "is_hub_id",
    "load_questions",
    "validate_dataset",
    "validate_row",
    "write_jsonl",
]

logger = logging.getLogger(__name__)

ID = "id"  # unique, stable row key (the replay buffer stores these)
QUESTION = "question"  # question text without the RL closer
IMAGES = "images"  # list of images (PIL images, encoded bytes, {"bytes", "path"} dicts or paths)
ANSWER = "answer"  # reference answer a* for the grader
SOURCE = "source"  # upstream dataset, e.g. "vero" or "mmfinereason"
SUBDATASET = "subdataset"  # canonical sub-dataset name, e.g. "ai2d"

COLUMNS = (ID, QUESTION, IMAGES, ANSWER, SOURCE, SUBDATASET)
# Given as numbers, these are read as their text ("answer": 16 is "16"): a JSON file's or table's own typing.
NUMBERS_AS_TEXT = (ID, ANSWER)


class DatasetError(ValueError):
    """A training set the run cannot train on, found before training (a bad row, file or image, or no valid row
    left); the recipe prints it as one ``error:`` line."""


_TEXT_FIELDS = (ID, QUESTION, ANSWER, SOURCE, SUBDATASET)


def _is_image(value) -> bool:
    if isinstance(value, (bytes, str)):
        return bool(value)
    if isinstance(value, Mapping):
        return bool(value.get("bytes") or value.get("path"))
    return hasattr(value, "size") and hasattr(value, "mode")  # a PIL image, without importing PIL


def validate_row(row: Mapping, index) -> None:
    """Raise ``ValueError`` naming ``index`` and the field when ``row`` breaks the schema.

    Every column of :data:`COLUMNS` must be present; the text fields must be non-empty
    strings; ``images`` must be a list (empty for text-only rows) of images, each one's file
    present and decodable.
    """
    if not isinstance(row, Mapping):
        raise ValueError(f"row {index}: expected a mapping, got {type(row).__name__}")
    for field in COLUMNS:
        if field not in row:
            raise ValueError(f"row {index}: missing field {field!r}")
    for field in _TEXT_FIELDS:
        value = row[field]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"row {index}: field {field!r} must be a non-empty string, got {value!r:.80}")
    images = row[IMAGES]
    if not isinstance(images, list):
        raise ValueError(f"row {index}: field {IMAGES!r} must be a list, got {type(images).__name__}")
    for position, image in enumerate(images):
        if not _is_image(image):
            raise ValueError(f"row {index}: field {IMAGES!r} item {position} is not an image ({type(image).__name__})")
        problem = _undecodable(image)
        if problem:
            raise ValueError(f"row {index}: field {IMAGES!r} item {position}: {problem}")


def _undecodable(image) -> str | None:
    """Why ``image`` (a path, encoded bytes or a ``{"bytes", "path"}`` entry) cannot be decoded, or None: its file
    must exist and its bytes must be an image PIL can read (checked by ``verify``, without decoding every pixel)."""
    import io

    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Mapping):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, str):
        if not Path(image).is_file():
            return f"no such image file {image!r}"
        source = image
    elif isinstance(image, bytes):
        source = io.BytesIO(image)
    else:  # a decoded PIL image
        return None
    try:
        with Image.open(source) as opened:
            opened.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        where = f"{image!r}" if isinstance(image, str) else "its bytes"
        return f"{where} is not an image PIL can decode ({type(err).__name__}: {err})"
    return None


# ---------------------------------------------------------------------- whole datasets


def validate_dataset(dataset, skip_invalid: bool = False):
    """Check every row of ``dataset`` against the schema, up front.

    A bad row (see :func:`validate_row`) or a repeated ``id`` raises :class:`DatasetError`
    naming the row and field; with ``skip_invalid`` it is dropped instead, and the count
    and the first reasons are logged; a dataset with no row, or none valid, is an error.
    Ids and answers typed as numbers are cast to their text first. Returns ``(dataset,
    skipped)`` where ``skipped`` lists ``(row, reason)``. Each image's file must exist and
    PIL must be able to read it (``verify``: its headers and checksums, not every pixel).
    """
    import datasets
    from tqdm.auto import tqdm

    if len(dataset) == 0:
        raise DatasetError("the dataset has no rows")
    missing = [c for c in COLUMNS if c not in dataset.column_names]
    if missing:  # a schema problem, not a row problem: never skippable
        raise DatasetError(
            f"dataset is missing column(s) {missing}; expected the columns {list(COLUMNS)} of zppo_trl.data"
        )
    dataset = _numbers_as_text(dataset)
    view = dataset.select_columns(list(COLUMNS))
    if _is_image_list(view.features[IMAGES]):
        view = view.cast_column(IMAGES, datasets.List(datasets.Image(decode=False)))
    skipped: list[tuple[int, str]] = []
    seen: dict[Any, int] = {}
    for index, row in enumerate(tqdm(view, total=len(view), desc="validating rows", unit="row", mininterval=2.0)):
        try:
            validate_row(row, index)
            if row[ID] in seen:
                raise ValueError(
                    f"row {index}: field {ID!r} repeats row {seen[row[ID]]} ({row[ID]!r}); ids key the replay buffer"
                )
            seen[row[ID]] = index
        except ValueError as err:
            if not skip_invalid:
                raise DatasetError(f"{err} (pass --skip_invalid to drop bad rows instead)") from None
            skipped.append((index, str(err)))
    if len(skipped) == len(view):
        raise DatasetError(
            f"no valid row left: all {len(view)} rows are invalid, so nothing could be trained; first: "
            + "; ".join(reason for _, reason in skipped[:3])
        )
    if skipped:
        bad = {index for index, _ in skipped}
        dataset = dataset.select([i for i in range(len(dataset)) if i not in bad])
        logger.warning(
            "skipped %d invalid row(s) of %d; first: %s",
            len(skipped),
            len(bad) + len(dataset),
            "; ".join(r for _, r in skipped[:3]),
        )
    return dataset, skipped


def _numbers_as_text(dataset):
    """``dataset`` with the :data:`NUMBERS_AS_TEXT` columns that a file typed as numbers cast to their text."""
    import datasets

    for column in NUMBERS_AS_TEXT:
        feature = dataset.features.get(column)
        if isinstance(feature, datasets.Value) and feature.dtype != "string" and feature.dtype != "bool":
            dataset = dataset.cast_column(column, datasets.Value("string"))
    return dataset


def _is_image_list(feature) -> bool:
    import datasets

    return isinstance(getattr(feature, "feature", None), datasets.Image)


_SUFFIX_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
# Endings that make a name a file, never a Hub repository.
_FILE_SUFFIXES = (
    *_SUFFIX_BUILDERS,
    ".csv",
    ".tsv",
    ".txt",
    ".arrow",
    ".gz",
    ".zip",
    ".tar",
    ".zst",
    ".safetensors",
    ".bin",
    ".gguf",
)


def is_hub_id(name: str | None) -> bool:
    """Whether ``name`` is a Hugging Face Hub repository id rather than a local path.

    The rule: nothing by that name exists here, and it reads ``org/name``: exactly one
    ``/`` between two non-empty parts, no leading ``.``, ``/`` or ``~``, and no file suffix
    (``.jsonl``, ``.parquet``, ...). So ``Qwen/Qwen3.5-2B`` is a Hub id, while
    ``recipes/data/nope.jsonl``, ``./data/zppo-77k`` and ``data`` are paths (that a run
    reports as missing when they do not exist).
    """
    if not name or not isinstance(name, str) or Path(name).expanduser().exists():
        return False
    if name.startswith((".", "/", "~")) or "\\" in name or name.lower().endswith(_FILE_SUFFIXES):
        return False
    parts = name.split("/")
    return len(parts) == 2 and all(part.strip() == part and part for part in parts)


def _local_dataset(path: Path, split: str, skip_invalid: bool = False):
    """The dataset at ``path`` and the lines of its JSONL files skipped as unreadable (see :func:`read_jsonl`)."""
    import datasets

    if path.is_dir() and any(
        (path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    ):
        loaded = datasets.load_from_disk(str(path))  # a `save_to_disk` folder
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path}: no split {split!r} (has {list(loaded)})")
            loaded = loaded[split]
        return loaded, []
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in _SUFFIX_BUILDERS)
    builders = {_SUFFIX_BUILDERS.get(p.suffix) for p in files}
    if not files or None in builders or len(builders) > 1:
        raise ValueError(
            f"{path}: expected a .parquet/.jsonl file, a folder of them (one format), or a save_to_disk folder"
        )
    if all(p.suffix == ".jsonl" for p in files):  # read here: a bad line is named by file and line
        rows, skipped = read_jsonl(files, skip_invalid)
        return datasets.Dataset.from_list(rows), skipped
    return datasets.load_dataset(builders.pop(), data_files=[str(p) for p in files], split="train"), []


def read_jsonl(files, skip_invalid: bool = False) -> tuple[list[dict], list[tuple[int, str]]]:
    """The rows of JSON Lines ``files``, in order: each line decoded as UTF-8 and parsed as one JSON object, the
    :data:`NUMBERS_AS_TEXT` fields given as numbers read as their text (so one number among strings does not
    retype a column). A line that is not UTF-8 or not a JSON object raises :class:`DatasetError` naming the file
    and line, or with ``skip_invalid`` is skipped: ``(row index it would have had, reason)``. Blank lines are
    left out."""
    rows: list[dict] = []
    skipped: list[tuple[int, str]] = []
    for path in files:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    row = _jsonl_row(raw)
                except ValueError as err:
                    reason = f"{path}:{number}: {err}"
                    if not skip_invalid:
                        raise DatasetError(f"{reason} (pass --skip_invalid to drop bad rows instead)") from None
                    skipped.append((len(rows) + len(skipped), reason))
                    continue
                rows.append(row)
    return rows, skipped


def _jsonl_row(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    for field in NUMBERS_AS_TEXT:
        value = row.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[field] = str(value)
    return row


def _absolute_image_paths(dataset, root: Path):
    """Resolve relative image paths against ``root`` (the data file's folder, or the folder given)."""

    def resolve(images):
        out = []
        for image in images or []:
            if isinstance(image, str) and image and not Path(image).is_absolute():
                image = str(root / image)
            elif isinstance(image, Mapping) and isinstance(image.get("path"), str) and not image.get("bytes"):
                image = (
                    {**image, "path": str(root / image["path"])} if not Path(image["path"]).is_absolute() else image
                )
            out.append(image)
        return out

    return dataset.map(lambda row: {IMAGES: resolve(row[IMAGES])}, desc="resolving image paths")


def load_questions(source: str, split: str = "train", *, name: str | None = None, skip_invalid: bool = False):
    """Load and validate a training set in this module's schema.

    ``source`` is a local path (a ``.parquet`` or ``.jsonl`` file, a folder of them, or a
    ``Dataset.save_to_disk`` folder) or a Hub dataset id (``name`` is its config; see
    :func:`is_hub_id` for which names are ids; any other missing name is an error). The
    ``images`` column is decoded to PIL images (paths, bytes and ``{"bytes", "path"}``
    entries all work). Every row is validated up front (:func:`validate_dataset`; a JSONL
    file's lines by :func:`read_jsonl`): a bad row is a :class:`DatasetError` naming the
    row and field (a bad line: its file and line), or with ``skip_invalid`` a counted,
    logged skip; none left is an error. Returns ``(dataset, skipped)``.
    """
    import datasets

    path = Path(source).expanduser()
    unreadable: list[tuple[int, str]] = []
    if path.exists():
        dataset, unreadable = _local_dataset(path, split, skip_invalid)
        if IMAGES in dataset.column_names and not _is_image_list(dataset.features[IMAGES]) and any(dataset[IMAGES]):
            dataset = _absolute_image_paths(dataset, path if path.is_dir() else path.parent)
    elif is_hub_id(source):
        dataset = datasets.load_dataset(source, name, split=split)
    else:
        raise FileNotFoundError(
            f"dataset {source!r}: no such file or folder (a Hub id reads org/name, without a file suffix)"
        )
    if unreadable and len(dataset) == 0:
        raise DatasetError(f"no valid row left: every line is unreadable; first: {unreadable[0][1]}")
    dataset, skipped = validate_dataset(dataset, skip_invalid=skip_invalid)
    if unreadable:
        logger.warning("skipped %d unreadable line(s); first: %s", len(unreadable), unreadable[0][1])
        skipped = sorted(unreadable + skipped)
    if not _is_image_list(dataset.features[IMAGES]) and any(dataset[IMAGES]):
        dataset = dataset.cast_column(IMAGES, datasets.List(datasets.Image()))
    return dataset, skipped


# ---------------------------------------------------------------------- the demo's bundled questions

# A worked example in front of every demo question, as "Q: ... A: ...": a 135M model copies
# its answer format (and so ends with a gradable \\boxed{}) far more often than it follows a
# closer alone (measured: 55% of replies gradable at temperature 0.5, against 17% without).
DEMO_EXAMPLE = (
    "Q: Ann has 2 cats. She gets 3 more cats. How many cats does Ann have?\n"
    "A: 2 + 3 = 5. The answer is \\boxed{5}.\n\nQ: "
)

_NAMES = ("Tom", "Sara", "Ben", "Mia", "Leo", "Zoe", "Sam", "Ivy")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "coins")

# kind -> (template, expression); the expression is evaluated independently to verify the answer.
_DEMO_TEMPLATES = {
    "add": ("{name} has {a} {items}. {name} gets {b} more {items}. How many {items} does {name} have?", "{a} + {b}"),
    "sub": ("{name} had {a} {items} and gave away {b}. How many {items} does {name} have left?", "{a} - {b}"),
    "mul": ("There are {a} boxes with {b} {items} in each box. How many {items} are there?", "{a} * {b}"),
    "div": ("{a} {items} are shared equally among {b} friends. How many {items} does each friend get?", "{a} / {b}"),
    "two_step": (
        "{name} has {a} {items}, gets {b} more and gives away {c}. How many {items} does {name} have now?",
        "{a} + {b} - {c}",
    ),
}

# Kinds in order of appearance: mostly one-step addition and multiplication, which the
# model gets right when decoding greedily but often not when sampling (so a near-greedy
# teacher can help), and some subtraction, division and two-step problems it mostly fails.
_DEMO_CYCLE = ("add", "mul", "add", "sub", "mul", "add", "div", "mul", "add", "two_step")

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(expression: str):
    """Evaluate +, -, *, / over integer literals (no ``eval``)."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


def _demo_numbers(kind: str, rng: random.Random) -> dict:
    if kind == "add":
        return {"a": rng.randint(2, 9), "b": rng.randint(2, 9)}
    if kind == "sub":
        b = rng.randint(2, 9)
        return {"a": b + rng.randint(1, 9), "b": b}
    if kind == "mul":
        return {"a": rng.randint(2, 6), "b": rng.randint(2, 6)}
    if kind == "div":
        b, q = rng.randint(2, 5), rng.randint(2, 6)
        return {"a": b * q, "b": b}
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}


def demo_questions(n: int = 240, seed: int = 0) -> list[dict]:
    """``n`` generated arithmetic word problems in this module's schema, with verified answers.

    Kinds cycle through :data:`_DEMO_CYCLE` (add and mul 7 in 10, sub, div and two-step
    the rest), with small numbers: easy enough that a 135M instruct model solves some,
    hard enough that it fails others. Each
    answer is the template's expression evaluated on its own and checked to be a
    non-negative integer. Deterministic given ``seed``.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = _DEMO_CYCLE[i % len(_DEMO_CYCLE)]
        template, expression = _DEMO_TEMPLATES[kind]
        numbers = _demo_numbers(kind, rng)
        value = _evaluate(expression.format(**numbers))
        if value != int(value) or value < 0:
            raise AssertionError(f"demo question {i} ({kind}, {numbers}) has no non-negative integer answer: {value}")
        text = template.format(name=rng.choice(_NAMES), items=rng.choice(_ITEMS), **numbers)
        rows.append(
            {
                ID: f"demo-{i:04d}",
                QUESTION: DEMO_EXAMPLE + text,
                IMAGES: [],
                ANSWER: str(int(value)),
                SOURCE: "zppo-demo",
                SUBDATASET: kind,
            }
        )
    return rows


def write_jsonl(rows, path: str | Path) -> None:
    """Write text-only rows as JSON lines (one row per line, keys in schema order)."""
    with open(path, "w") as f:
        f.writelines(json.dumps({c: row[c] for c in COLUMNS}) + "\n" for row in rows)
