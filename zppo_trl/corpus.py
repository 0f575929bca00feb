"""Build ZPPO-77K, the paper's RL training corpus (the appendix section on the training corpus).

The recipe, in the order it runs:

1. Read the training split of each source in priority order: Vero-600k, then
   MMFineReason-SFT-586K. Only the question, answer, image(s), id, sub-dataset and
   ``pass_rate`` columns are read; the released reasoning traces are never loaded.
2. Map every raw sub-dataset name to a canonical name (:data:`NAME_MAP`). Names that
   are not in that source's tier lists (captioning/instruction-following, spatial-action,
   MMFineReason's GameQA, ...) are excluded and counted per raw name.
3. Name map with Vero priority: a canonical sub-dataset is drawn from the first source, in
   priority order, that has rows for it; the same name in a later source is dropped as a
   duplicate (e.g. MMFineReason ``AI2D`` when Vero has ``stem-ai2d_merged``).
4. Rows without a question, answer or image, or with a field that does not parse, are
   counted as invalid (with the reason) and dropped.
5. MMFineReason only: keep ``pass_rate < 0.5``. Vero has no ``pass_rate``; no difficulty
   filter.
6. Cap each sub-dataset (Tier 1: 2,800; Tier 2: 1,400) by a seeded uniform sample.
7. Then the three per-sample filters, in this order: answer <= 512 characters,
   min(h, w) >= 100 pixels for every image (images that do not decode, or that the
   student's processor rejects, are counted as corrupt here), and the plain-rollout prompt
   <= 4,096 tokens counted with the student's processor.

Streaming and memory: the cap is a seeded bottom-k sample. Every row gets the priority
``blake2b(seed, source, sub-dataset, row id)``; a sub-dataset keeps the ``cap`` rows with the
smallest priorities, which is a uniform sample without replacement that depends only on the
seed and the row ids, not on read order. One pass over each source keeps a bounded heap of
``cap`` entries per sub-dataset; a row is materialised only when it enters a heap, and then
its encoded image bytes go to a spill file on disk, so memory holds heap entries, never
images. Images are decoded only after the cap, for rows that can still survive.

Choices where the paper is silent (all configurable through :class:`CorpusConfig`):

- Name map: "Vero is the priority source" is read per sub-dataset: a duplicate sub-dataset is
  taken whole from Vero (one cap), MMFineReason's copy is dropped, not merged row by row.
  MMFineReason's copy is used only when Vero has no rows for that name.
- Vero's two WeMath configs (``wemath20_pro``/``wemath20_standard``) form the one ``wemath``
  sub-dataset of the paper (one cap).
- ``pass_rate < 0.5`` is strict, as written in this paper (an earlier draft dropped only
  ``> 0.5``); a missing ``pass_rate`` is an invalid row.
- Rows with missing or unparsable fields are dropped before the cap (they are not samples);
  corrupt images are found when images are decoded, after the cap, and count as a filter drop.
- Filters count a row under the first one it fails, in the order above.
- Answer length is ``len(answer.strip())``; the image filter applies to every image of a row.
- The prompt length is what the trainer sees: the student's chat template applied to one
  user turn (images, then ``compose_prompt(question)``, i.e. question + RL closer), with the
  generation prompt, image placeholders expanded to the processor's image-token count.
- ``<image>`` placeholders are removed from the question text (the image travels separately).
- A row's id is ``"{source}/{sub-dataset}/{upstream id}"`` (``#2``, ``#3``, ... appended to
  repeats); without an upstream id the position in the file is used. The sampling key is
  the upstream id (with the config name), so the sample does not depend on read order.

Source schemas (see :data:`VERO` and :data:`MMFINEREASON`, the only place columns are named):

- Vero-600k, confirmed from its official export script (zlab-princeton/vero,
  ``scripts/download_and_format_vero_600k.py``): one Hub config per sub-dataset, splits
  ``train``/``val``, columns ``id``, ``data_source``, ``prompt``, ``image`` (one image),
  ``ability``, ``reward_model.ground_truth``, ``extra_info.{question, answer, reward_type,
  index}``. Config names ``{category}-{name}`` (``stem-ai2d_merged``, ``chart_ocr-CoSyn_400k_chart``,
  ``counting_grounding_search-multihop``, ...) are confirmed by the paper's example and
  third-party code; the names of ``chartqa``, ``arxivqa``, the WeMath pair and the
  knowledge/recognition configs are assumed from Vero's data documentation.
- MMFineReason-SFT-586K: one default config, ``data/train-*.parquet``, columns ``id``,
  ``question`` (with an ``<image>`` marker), ``answer`` (short reference answer),
  ``original_answer`` and ``qwen3vl_235b_thinking_response`` (traces, never read),
  ``image``, ``source``, ``pass_rate``: confirmed from third-party loaders, not from the
  card itself. ``source`` values are assumed to be the release's sub-dataset directory names
  (``FineVision-ai2d_merged``, ``FineVision-geo170k(qa)``, ``Euclid30K``, ``MMR1``, ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import io
import json
import math
import os
import pickle
import re
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from zppo_trl import data
from zppo_trl.prompts import RL_CLOSER, compose_prompt

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_PASS_RATE",
    "MAX_PROMPT_TOKENS",
    "MIN_IMAGE_SIDE",
    "MMFINEREASON",
    "MMFINEREASON_SUBDATASETS",
    "NAME_MAP",
    "TIER_CAPS",
    "VERO",
    "VERO_SUBDATASETS",
    "CorpusConfig",
    "CorpusReport",
    "PromptTokenCounter",
    "SourceSpec",
    "SubdatasetCounts",
    "build_corpus",
    "canonical_name",
    "push_corpus_to_hub",
]

# --- The recipe (the paper's corpus appendix) ------------------------------------------------

# The 29 Vero sub-datasets, canonical name -> tier.
VERO_SUBDATASETS: dict[str, int] = {
    **dict.fromkeys(
        [
            "ai2d",
            "geo170k",
            "geomverse",
            "geoqa_plus",
            "mmk12",
            "cosyn_math",
            "cosyn_chart",
            "cosyn_diagram",
            "cosyn_table",
            "wemath",
            "tqa",
            "visualwebinstruct",
            "chartqa",
            "arxivqa",
        ],
        1,
    ),
    **dict.fromkeys(
        [
            "pathvqa",
            "vqarad",
            "raven",
            "evochart",
            "infographic_vqa",
            "aokvqa",
            "gqa",
            "iconqa",
            "vqav2",
            "visual7w",
            "tallyqa",
            "pixelreasoner",
            "multihop",
            "pixmo",
            "visual_probe",
        ],
        2,
    ),
}

# The MMFineReason sub-datasets, canonical name -> tier (Geo3K/Geometry3K is one sub-dataset).
MMFINEREASON_SUBDATASETS: dict[str, int] = {
    **dict.fromkeys(
        [
            "mmr1",
            "euclid",
            "geo170k",
            "geo3k",
            "mm-openr1",
            "wemath",
            "visualwebinstruct",
            "bmmr",
            "tqa",
            "ai2d",
            "scienceqa",
            "virl39k",
        ],
        1,
    ),
    **dict.fromkeys(["raven", "visualsphinx", "puzzleqa", "llava-cot", "zebra-cot"], 2),
}

TIER_CAPS: dict[int, int] = {1: 2800, 2: 1400}
MAX_ANSWER_CHARS = 512
MIN_IMAGE_SIDE = 100
MAX_PROMPT_TOKENS = 4096
MAX_PASS_RATE = 0.5  # keep pass_rate < 0.5

# Category prefixes of Vero configs and MMFineReason's FineVision sources, stripped before the map.
_PREFIXES = (
    "stem-",
    "chart_ocr-",
    "counting_grounding_search-",
    "knowledge_recognition-",
    "spatial_action-",
    "captioning_if-",
    "finevision-",
)

# Raw (lower-cased, prefix-stripped, trailing "(...)" removed) name -> canonical name.
# Names not listed here are their own canonical name.
NAME_MAP: dict[str, str] = {
    "ai2d_merged": "ai2d",
    "cosyn_400k_math": "cosyn_math",
    "cosyn_400k_chart": "cosyn_chart",
    "cosyn_400k_diagram": "cosyn_diagram",
    "cosyn_400k_table": "cosyn_table",
    "wemath20_pro": "wemath",
    "wemath20_standard": "wemath",
    "chartqa_difficulty": "chartqa",
    "arxivqa_formatted": "arxivqa",
    "multihop_qa": "multihop",
    "infographicvqa": "infographic_vqa",
    "geo170k_qa_": "geo170k",
    "geometry3k": "geo3k",
    "geometry3k_mathv360k_": "geo3k",
    "visualwebinstruct_filtered_": "visualwebinstruct",
    "euclid30k": "euclid",
    "mm_openr1": "mm-openr1",
    "llava_cot": "llava-cot",
    "zebra_cot": "zebra-cot",
}


def canonical_name(raw: str, name_map: Mapping[str, str] = NAME_MAP) -> str:
    """The canonical sub-dataset name of a raw config/``source`` value (``"stem-ai2d_merged"`` -> ``"ai2d"``)."""
    name = str(raw).strip().lower()
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    name = re.sub(r"\s*\(.*\)$", "", name)
    return name_map.get(name, name)


# --- Sources: every upstream column name lives here -----------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    """One upstream dataset and how its columns map onto :mod:`zppo_trl.data`.

    Field mappings are tuples of column paths (``"extra_info.question"`` reads a struct
    field); the first non-empty value wins. ``subdataset`` empty means the sub-dataset is
    the Hub config name (for a local snapshot: the directory directly under ``path``).
    ``path`` is a Hub id or a local parquet file or directory.
    """

    name: str
    path: str
    subdatasets: Mapping[str, int]
    id: tuple[str, ...]
    question: tuple[str, ...]
    answer: tuple[str, ...]
    images: tuple[str, ...]
    subdataset: tuple[str, ...] = ()
    pass_rate: str | None = None
    split: str = "train"
    configs: tuple[str, ...] | None = None  # Hub configs to read; None: every config whose name is listed

    def columns(self) -> list[str]:
        """The top-level columns this spec reads (projection: nothing else is loaded)."""
        paths = [*self.id, *self.question, *self.answer, *self.images, *self.subdataset]
        paths += [self.pass_rate] if self.pass_rate else []
        return list(dict.fromkeys(p.split(".", 1)[0] for p in paths))


VERO = SourceSpec(
    name="vero",
    path="zlab-princeton/Vero-600k",
    subdatasets=VERO_SUBDATASETS,
    id=("id", "extra_info.id", "extra_info.index"),
    question=("extra_info.question",),
    answer=("extra_info.answer", "reward_model.ground_truth"),
    images=("image", "images"),
)

MMFINEREASON = SourceSpec(
    name="mmfinereason",
    path="OpenDataArena/MMFineReason-SFT-586K-Qwen3-VL-235B-Thinking",
    subdatasets=MMFINEREASON_SUBDATASETS,
    id=("id",),
    question=("question",),
    answer=("answer",),
    images=("image", "images"),
    subdataset=("source",),
    pass_rate="pass_rate",
)


@dataclass
class CorpusConfig:
    """Everything a build depends on; the defaults are the paper's recipe.

    ``sources`` are in priority order (the name map keeps the first source that has a
    sub-dataset). ``tier_caps`` maps a tier to its per-sub-dataset cap (``None``: no cap).
    """

    output_dir: str
    sources: Sequence[SourceSpec] = (VERO, MMFINEREASON)
    seed: int = 0
    tier_caps: Mapping[int, int | None] = field(default_factory=lambda: dict(TIER_CAPS))
    max_answer_chars: int = MAX_ANSWER_CHARS
    min_image_side: int = MIN_IMAGE_SIDE
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    max_pass_rate: float = MAX_PASS_RATE
    name_map: Mapping[str, str] = field(default_factory=lambda: dict(NAME_MAP))
    closer: str = RL_CLOSER
    batch_size: int = 1024
    progress: bool = True


# --- Report -------------------------------------------------------------------------------


@dataclass
class SubdatasetCounts:
    """Provenance of one sub-dataset of one source.

    ``read - duplicate - invalid - pass_rate == before_cap``; ``after_cap == min(before_cap, cap)``;
    ``after_cap - answer_too_long - corrupt_image - image_too_small - prompt_too_long == kept``.
    ``reasons`` details ``invalid`` and ``corrupt_image`` (which also counts images the
    student's processor rejects, ``unprocessable_image:*``); ``raw_names`` shows what the
    name map merged.
    """

    source: str
    subdataset: str
    tier: int
    cap: int | None
    read: int = 0
    duplicate: int = 0
    invalid: int = 0
    pass_rate: int = 0
    before_cap: int = 0
    after_cap: int = 0
    answer_too_long: int = 0
    corrupt_image: int = 0
    image_too_small: int = 0
    prompt_too_long: int = 0
    kept: int = 0
    reasons: Counter = field(default_factory=Counter)
    raw_names: Counter = field(default_factory=Counter)  # upstream config/source name -> rows read


_TABLE_COLUMNS = (
    ("read", "read"),
    ("duplicate", "dup"),
    ("invalid", "invalid"),
    ("pass_rate", "pass>=.5"),
    ("before_cap", "pre-cap"),
    ("after_cap", "post-cap"),
    ("answer_too_long", "answer"),
    ("corrupt_image", "corrupt"),
    ("image_too_small", "small"),
    ("prompt_too_long", "prompt"),
    ("kept", "kept"),
)


@dataclass
class CorpusReport:
    """Counts per sub-dataset before and after each cap and filter, plus exclusions and errors."""

    subdatasets: list[SubdatasetCounts]
    excluded: dict[str, dict[str, int]]  # source -> raw sub-dataset name -> rows (not in the paper's lists)
    skipped_configs: dict[str, list[str]]  # source -> Hub configs never read (not in the lists)
    errors: list[dict]
    settings: dict
    output: str

    def totals(self) -> dict[str, int]:
        """Column sums over all sub-datasets."""
        return {key: sum(getattr(c, key) for c in self.subdatasets) for key, _ in _TABLE_COLUMNS}

    def to_dict(self) -> dict:
        """JSON-serialisable form (what ``report.json`` holds)."""
        rows = [
            {
                **dataclasses.asdict(c),
                "reasons": dict(sorted(c.reasons.items())),
                "raw_names": dict(sorted(c.raw_names.items())),
            }
            for c in self.subdatasets
        ]
        return {
            "output": self.output,
            "settings": self.settings,
            "totals": self.totals(),
            "subdatasets": rows,
            "excluded": self.excluded,
            "skipped_configs": self.skipped_configs,
            "errors": self.errors,
        }

    def format_table(self) -> str:
        """A fixed-width table: one line per sub-dataset, then the totals."""
        head = ["source", "subdataset", "tier", "cap"] + [label for _, label in _TABLE_COLUMNS]
        lines = [
            [c.source, c.subdataset, str(c.tier), "-" if c.cap is None else str(c.cap)]
            + [str(getattr(c, key)) for key, _ in _TABLE_COLUMNS]
            for c in self.subdatasets
        ]
        totals = self.totals()
        lines.append(["total", "", "", ""] + [str(totals[key]) for key, _ in _TABLE_COLUMNS])
        widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head))]

        def fmt(row):  # names left-aligned, numbers right-aligned
            return "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))

        rule = "-" * len(fmt(head))
        text = [fmt(head), rule, *map(fmt, lines[:-1]), rule, fmt(lines[-1])]
        for source, names in self.excluded.items():
            if names:
                text.append(
                    f"excluded from {source} (not in the paper's lists): "
                    + ", ".join(f"{k} ({v})" for k, v in sorted(names.items()))
                )
        for source, configs in self.skipped_configs.items():
            if configs:
                text.append(f"configs of {source} not read: {', '.join(configs)}")
        text += [f"error: {e['where']}: {e['error']}" for e in self.errors]
        return "\n".join(text)

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``report.json`` and ``report.txt`` into ``directory``."""
        directory = Path(directory)
        (directory / "report.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        (directory / "report.txt").write_text(self.format_table() + "\n")


# --- Prompt length ---------------------------------------------------------------------------


class PromptTokenCounter:
    """Token length of the plain-rollout prompt of a question, with the student's processor.

    The prompt is the processor's chat template over one user turn (one image part per
    image, then ``compose_prompt(question, closer=closer)``) with the generation prompt,
    every image placeholder expanded to that image's token count. When the processor can
    count image tokens from sizes (Qwen VL processors) no pixels are processed; otherwise
    the processor runs on the images. A tokenizer alone counts the text only.
    """

    def __init__(self, processor, closer: str = RL_CLOSER):
        self.processor = processor
        self.closer = closer
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.vision = getattr(processor, "image_processor", None) is not None
        token = getattr(processor, "image_token", None)
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(token) if token else None
        self.template = getattr(processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        self._image_tokens: dict[tuple[int, int], int] = {}  # (height, width) -> image tokens

    def _tokens_of(self, image) -> int:
        size = (image.height, image.width)
        if size not in self._image_tokens:
            self._image_tokens[size] = self.processor._get_num_multimodal_tokens(image_sizes=[size]).num_image_tokens[
                0
            ]
        return self._image_tokens[size]

    def _text(self, question: str, num_images: int) -> str:
        prompt = compose_prompt(question, closer=self.closer)
        if not self.template:
            return prompt
        content = [{"type": "image"}] * num_images + [{"type": "text", "text": prompt}] if self.vision else prompt
        owner = self.processor if self.vision else self.tokenizer
        messages = [{"role": "user", "content": content}]
        return owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def __call__(self, question: str, images: Sequence = ()) -> int:
        """Tokens of the prompt for ``question`` with ``images`` (PIL images)."""
        if not self.vision:
            return len(self.tokenizer(self._text(question, 0))["input_ids"])
        text = self._text(question, len(images))
        if images and self.image_token_id is not None and hasattr(self.processor, "_get_num_multimodal_tokens"):
            ids = self.tokenizer(text)["input_ids"]
            placeholders = ids.count(self.image_token_id)
            if placeholders == len(images):
                return len(ids) - placeholders + sum(self._tokens_of(image) for image in images)
        out = self.processor(text=[text], images=list(images) or None)
        return len(out["input_ids"][0])


# --- Reading ----------------------------------------------------------------------------------


def _in_split(relative: Path, split: str) -> bool:
    stem = relative.name.split(".", 1)[0]
    return stem == split or stem.startswith(f"{split}-") or split in relative.parts[:-1]


def _local_units(spec: SourceSpec) -> list[tuple[str | None, Path]]:
    """(config, parquet file) pairs of the split, sorted; config = directory under the root."""
    root = Path(spec.path)
    if root.is_file():
        return [(None, root)]
    units = []
    for file in sorted(root.rglob("*.parquet")):
        relative = file.relative_to(root)
        if not _in_split(relative, spec.split):
            continue
        top = relative.parts[0] if len(relative.parts) > 1 else None
        units.append((None if top in (None, "data", spec.split) else top, file))
    return units


def _column(batch: pa.RecordBatch, path: str):
    """The array at ``path`` (``"a.b"`` reads struct field ``b`` of column ``a``), or None."""
    name, *fields = path.split(".")
    if name not in batch.schema.names:
        return None
    array = batch.column(name)
    for sub in fields:
        if not pa.types.is_struct(array.type) or array.type.get_field_index(sub) < 0:
            return None
        array = pc.struct_field(array, sub)
    return array


def _first_values(batch: pa.RecordBatch, paths: Sequence[str]) -> list:
    """Per row, the first value among ``paths`` that is neither null nor blank."""
    values = [None] * batch.num_rows
    for path in paths:
        array = _column(batch, path)
        if array is None:
            continue
        for i, value in enumerate(array.to_pylist()):
            if values[i] is None and value is not None and not (isinstance(value, str) and not value.strip()):
                values[i] = value
    return values


def _image_presence(array: pa.Array) -> pa.Array:
    """Whether each cell holds at least one image reference (without touching image bytes)."""
    kind = array.type
    if pa.types.is_struct(kind):
        refs = [pc.is_valid(pc.struct_field(array, f)) for f in ("bytes", "path") if kind.get_field_index(f) >= 0]
        present = refs[0] if len(refs) == 1 else pc.or_(*refs) if refs else pc.is_valid(array)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        present = pc.greater(pc.list_value_length(array), 0)
    elif pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind):
        present = pc.greater(pc.binary_length(array), 0)
    else:
        present = pc.is_valid(array)
    return pc.fill_null(pc.and_(pc.is_valid(array), present), False)


def _image_refs(value) -> list[dict]:
    """A cell of an image column as a list of ``{"bytes", "path"}`` dicts."""
    items = value if isinstance(value, list) else [value]
    refs = []
    for item in items:
        if isinstance(item, dict):
            refs.append({"bytes": item.get("bytes"), "path": item.get("path")})
        elif isinstance(item, bytes):
            refs.append({"bytes": item, "path": None})
        elif isinstance(item, str):
            refs.append({"bytes": None, "path": item})
        else:  # not an image reference: decoding reports it as corrupt
            refs.append({"bytes": None, "path": None})
    return refs


def _text(value, field_name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    raise ValueError(f"unparsable:{field_name}")


# --- Sampling under a cap -----------------------------------------------------------------------


def _priority(seed: int, source: str, subdataset: str, key: str) -> int:
    digest = hashlib.blake2b(f"{seed}\x1f{source}\x1f{subdataset}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _BottomK:
    """The ``cap`` entries with the smallest priority seen so far (a max-heap on priority)."""

    def __init__(self, cap: int | None):
        self.cap = cap
        self.heap: list[tuple[int, int, int, int]] = []  # (-priority, -seq, offset, length)

    def admits(self, priority: int) -> bool:
        return self.cap is None or len(self.heap) < self.cap or priority < -self.heap[0][0]

    def push(self, priority: int, seq: int, offset: int, length: int) -> None:
        entry = (-priority, -seq, offset, length)
        if self.cap is not None and len(self.heap) >= self.cap:
            heapq.heapreplace(self.heap, entry)
        elif self.cap != 0:
            heapq.heappush(self.heap, entry)

    def selected(self) -> list[tuple[int, int, int]]:
        """(seq, offset, length) of the kept entries, in read order."""
        return sorted((-seq, offset, length) for _, seq, offset, length in self.heap)


# --- The build --------------------------------------------------------------------------------------


def _output_schema() -> pa.Schema:
    """The output's Arrow schema, with the Hugging Face features (images as ``Image``) in its metadata."""
    import datasets

    return datasets.Features(
        {
            data.ID: datasets.Value("string"),
            data.QUESTION: datasets.Value("string"),
            data.IMAGES: datasets.List(datasets.Image()),
            data.ANSWER: datasets.Value("string"),
            data.SOURCE: datasets.Value("string"),
            data.SUBDATASET: datasets.Value("string"),
        }
    ).arrow_schema


class _Builder:
    def __init__(self, config: CorpusConfig, processor):
        self.config = config
        self.count_tokens = PromptTokenCounter(processor, closer=config.closer)
        self.counts: dict[tuple[str, str], SubdatasetCounts] = {}
        self.samplers: dict[tuple[str, str], _BottomK] = {}
        self.owner: dict[str, str] = {}
        self.excluded: dict[str, Counter] = {}
        self.skipped: dict[str, list[str]] = {}
        self.errors: list[dict] = []
        self.seq = 0

    # Phase 1: stream every source once, cap with bounded heaps, spill admitted rows to disk.

    def _batches(self, spec: SourceSpec) -> Iterator[tuple[str | None, str, pa.RecordBatch]]:
        """(config, unit name, batch) over the source's split, projected to the spec's columns."""
        if Path(spec.path).exists():
            units = _local_units(spec)
            total = 0
            for _, file in units:
                try:
                    total += pq.ParquetFile(file).metadata.num_rows
                except Exception:  # reported when the file is read below
                    pass
            bar = tqdm(total=total, desc=f"read {spec.name}", unit="row", disable=not self.config.progress)
            for config, file in units:
                try:
                    parquet = pq.ParquetFile(file)
                    names = set(parquet.schema_arrow.names)
                    columns = [c for c in spec.columns() if c in names]
                    for batch in parquet.iter_batches(batch_size=self.config.batch_size, columns=columns):
                        yield config, str(file), batch
                        bar.update(batch.num_rows)
                except Exception as error:  # a broken file is reported, never fatal
                    self.errors.append({"where": str(file), "error": f"{type(error).__name__}: {error}"})
            bar.close()
        else:
            yield from self._hub_batches(spec)

    def _hub_batches(self, spec: SourceSpec):
        import datasets

        configs = list(spec.configs) if spec.configs else datasets.get_dataset_config_names(spec.path)
        if not spec.subdataset:  # config-keyed: never download configs outside the lists
            listed = [c for c in configs if canonical_name(c, self.config.name_map) in spec.subdatasets]
            self.skipped[spec.name] = [c for c in configs if c not in listed]
            configs = listed
        bar = tqdm(desc=f"read {spec.name}", unit="row", disable=not self.config.progress)
        for config in configs:
            where = f"{spec.path}:{config}"
            try:
                stream = datasets.load_dataset(spec.path, name=config, split=spec.split, streaming=True)
                if stream.column_names:
                    stream = stream.select_columns([c for c in spec.columns() if c in stream.column_names])
                for table in stream.with_format("arrow").iter(batch_size=self.config.batch_size):
                    for batch in table.to_batches():
                        yield (config if not spec.subdataset else None), where, batch
                        bar.update(batch.num_rows)
            except Exception as error:
                self.errors.append({"where": where, "error": f"{type(error).__name__}: {error}"})
        bar.close()

    def _counts(self, spec: SourceSpec, name: str) -> SubdatasetCounts:
        key = (spec.name, name)
        if key not in self.counts:
            tier = spec.subdatasets[name]
            cap = self.config.tier_caps.get(tier)
            self.counts[key] = SubdatasetCounts(spec.name, name, tier, cap)
            self.samplers[key] = _BottomK(cap)
        return self.counts[key]

    def read_source(self, spec: SourceSpec, spill) -> None:
        excluded = self.excluded.setdefault(spec.name, Counter())
        positions: Counter = Counter()
        names: dict = {}  # raw sub-dataset name -> canonical name
        for config, unit, batch in self._batches(spec):
            try:
                subs = _first_values(batch, spec.subdataset) if spec.subdataset else [None] * batch.num_rows
                ids = _first_values(batch, spec.id)
                questions = _first_values(batch, spec.question)
                answers = _first_values(batch, spec.answer)
                rates = _first_values(batch, [spec.pass_rate]) if spec.pass_rate else None
                image_arrays = [a for a in (_column(batch, p) for p in spec.images) if a is not None]
                present = [_image_presence(a).to_pylist() for a in image_arrays]
            except Exception as error:  # columns of unexpected types: report the batch, go on
                positions[unit] += batch.num_rows
                self.errors.append(
                    {"where": unit, "error": f"{batch.num_rows} unparsable rows: {type(error).__name__}: {error}"}
                )
                continue
            for i in range(batch.num_rows):
                position = positions[unit]
                positions[unit] += 1
                raw = subs[i] if subs[i] is not None else config
                if raw not in names:
                    names[raw] = canonical_name(raw, self.config.name_map) if raw is not None else None
                name = names[raw]
                if name not in spec.subdatasets:
                    excluded[str(raw)] += 1
                    continue
                counts = self._counts(spec, name)
                counts.read += 1
                counts.raw_names[str(raw)] += 1
                if self.owner.setdefault(name, spec.name) != spec.name:
                    counts.duplicate += 1
                    continue
                try:
                    record = self._parse(
                        spec,
                        ids[i],
                        questions[i],
                        answers[i],
                        rates[i] if rates else None,
                        [p[i] for p in present],
                        unit,
                        position,
                    )
                except ValueError as error:
                    counts.invalid += 1
                    counts.reasons[str(error)] += 1
                    continue
                if record is None:
                    counts.pass_rate += 1
                    continue
                counts.before_cap += 1
                # The config is part of the key: configs merged into one sub-dataset may share ids.
                key = record["key"] if config is None else f"{config}\x1f{record['key']}"
                priority = _priority(self.config.seed, spec.name, name, key)
                sampler = self.samplers[(spec.name, name)]
                if not sampler.admits(priority):
                    continue
                cell = next(a[i] for a, p in zip(image_arrays, present) if p[i])
                record["images"] = _image_refs(cell.as_py())
                blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
                offset = spill.tell()
                spill.write(blob)
                sampler.push(priority, self.seq, offset, len(blob))
                self.seq += 1

    def _parse(self, spec, raw_id, question, answer, rate, image_present, unit, position) -> dict | None:
        """A capped-stage record, None when the pass_rate filter drops it; ValueError names the reason."""
        if question is None:
            raise ValueError("missing:question")
        question = re.sub(r"\s*<image>\s*", " ", _text(question, "question")).strip()
        if not question:
            raise ValueError("missing:question")
        if answer is None:
            raise ValueError("missing:answer")
        answer = _text(answer, "answer").strip()
        if not answer:
            raise ValueError("missing:answer")
        if not any(image_present):
            raise ValueError("missing:image")
        if spec.pass_rate:
            if rate is None:
                raise ValueError("missing:pass_rate")
            try:
                rate = float(rate)
            except (TypeError, ValueError):
                raise ValueError("unparsable:pass_rate") from None
            if math.isnan(rate):
                raise ValueError("unparsable:pass_rate")
            if rate >= self.config.max_pass_rate:
                return None
        key = str(raw_id) if raw_id is not None else f"{Path(unit).name}#{position}"
        return {"key": key, "question": question, "answer": answer}

    # Phase 2: the three per-sample filters on capped rows; write the output.

    def _decode(self, refs: list[dict]):
        from PIL import Image

        images = []
        for ref in refs:
            raw = ref["bytes"]
            if raw is None and ref["path"] and os.path.isfile(ref["path"]):
                raw = Path(ref["path"]).read_bytes()
            if raw is None:
                raise ValueError("corrupt_image:no_bytes")
            image = Image.open(io.BytesIO(raw))
            image.load()
            images.append((raw, image))
        return images

    def filter_and_write(self, spill_path: str, writer: pq.ParquetWriter, ordered_keys) -> None:
        config = self.config
        total = sum(len(self.samplers[k].heap) for k in ordered_keys)
        bar = tqdm(total=total, desc="filter", unit="row", disable=not config.progress)
        ids: set[str] = set()
        with open(spill_path, "rb") as spill:
            for key in ordered_keys:
                counts, rows = self.counts[key], []
                selected = self.samplers[key].selected()
                counts.after_cap = len(selected)
                for _, offset, length in selected:
                    bar.update()
                    spill.seek(offset)
                    record = pickle.loads(spill.read(length))
                    row = self._filter(counts, record)
                    if row is None:
                        continue
                    row_id = f"{counts.source}/{counts.subdataset}/{record['key']}"
                    suffix = 1
                    while row_id in ids:  # upstream ids are not always unique
                        suffix += 1
                        row_id = f"{counts.source}/{counts.subdataset}/{record['key']}#{suffix}"
                    ids.add(row_id)
                    row[data.ID] = row_id
                    data.validate_row(row, row_id)
                    rows.append(row)
                    counts.kept += 1
                    if len(rows) >= 256:
                        writer.write_table(pa.Table.from_pylist(rows, schema=writer.schema))
                        rows = []
                if rows:
                    writer.write_table(pa.Table.from_pylist(rows, schema=writer.schema))
        bar.close()

    def _filter(self, counts: SubdatasetCounts, record: dict) -> dict | None:
        config = self.config
        if len(record["answer"]) > config.max_answer_chars:
            counts.answer_too_long += 1
            return None
        try:
            decoded = self._decode(record["images"])
        except Exception as error:
            counts.corrupt_image += 1
            reason = str(error) if str(error).startswith("corrupt_image:") else f"corrupt_image:{type(error).__name__}"
            counts.reasons[reason] += 1
            return None
        images = [image for _, image in decoded]
        if min(min(image.size) for image in images) < config.min_image_side:
            counts.image_too_small += 1
            return None
        try:
            tokens = self.count_tokens(record["question"], images)
        except Exception as error:  # e.g. an aspect ratio the student's processor rejects
            counts.corrupt_image += 1
            counts.reasons[f"unprocessable_image:{type(error).__name__}"] += 1
            return None
        if tokens > config.max_prompt_tokens:
            counts.prompt_too_long += 1
            return None
        return {
            data.QUESTION: record["question"],
            data.IMAGES: [{"bytes": raw, "path": None} for raw, _ in decoded],
            data.ANSWER: record["answer"],
            data.SOURCE: counts.source,
            data.SUBDATASET: counts.subdataset,
        }


def build_corpus(config: CorpusConfig, processor) -> CorpusReport:
    """Build the corpus into ``config.output_dir`` and return its provenance report.

    Writes ``data/train-00000-of-00001.parquet`` (columns :data:`zppo_trl.data.COLUMNS`,
    Hugging Face ``Image`` features, loadable with ``datasets.load_dataset(output_dir)``),
    ``report.json`` and ``report.txt``. ``processor`` is the student's processor (see
    :func:`zppo_trl.processing.load_processor`); it counts prompt tokens. Same sources,
    config and processor give the same corpus, byte for byte.
    """
    out = Path(config.output_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    builder = _Builder(config, processor)
    with tempfile.TemporaryDirectory(prefix="zppo-corpus-", dir=out) as scratch:
        spill_path = os.path.join(scratch, "spill.bin")
        with open(spill_path, "wb") as spill:
            for spec in config.sources:
                builder.read_source(spec, spill)
        # Report order: sources by priority, then each source's list order.
        ordered = [(s.name, n) for s in config.sources for n in s.subdatasets if (s.name, n) in builder.counts]
        target = out / "data" / "train-00000-of-00001.parquet"
        with pq.ParquetWriter(target, _output_schema()) as writer:
            builder.filter_and_write(spill_path, writer, ordered)
    report = CorpusReport(
        subdatasets=[builder.counts[k] for k in ordered],
        excluded={k: dict(sorted(v.items())) for k, v in builder.excluded.items()},
        skipped_configs=builder.skipped,
        errors=builder.errors,
        settings={
            "seed": config.seed,
            "tier_caps": {str(k): v for k, v in config.tier_caps.items()},
            "max_answer_chars": config.max_answer_chars,
            "min_image_side": config.min_image_side,
            "max_prompt_tokens": config.max_prompt_tokens,
            "max_pass_rate": config.max_pass_rate,
            "sources": [{"name": s.name, "path": str(s.path), "split": s.split} for s in config.sources],
            "processor": getattr(getattr(processor, "tokenizer", processor), "name_or_path", None)
            or type(processor).__name__,
        },
        output=str(target),
    )
    report.save(out)
    return report


def push_corpus_to_hub(output_dir: str | os.PathLike, repo_id: str, private: bool = False) -> None:
    """Push a built corpus (its parquet data and ``report.json``) to the Hub dataset ``repo_id``."""
    import datasets
    from huggingface_hub import HfApi

    output_dir = Path(output_dir)
    corpus = datasets.load_dataset("parquet", data_files=str(output_dir / "data" / "*.parquet"), split="train")
    corpus.push_to_hub(repo_id, private=private)
    HfApi().upload_file(
        path_or_fileobj=str(output_dir / "report.json"),
        path_in_repo="report.json",
        repo_id=repo_id,
        repo_type="dataset",
    )
