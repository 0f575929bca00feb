"""Loading one evaluation setting's rows, from the Hugging Face Hub or from a local copy.

`load_setting` returns the rows of one `TaskSpec` as plain dicts holding the upstream columns
unchanged (plus a few ``_``-prefixed bookkeeping keys), so that the scorers, judges and prompt
builders read exactly the fields `tasks.SUITE` names.

Where the rows come from (``source``):

* ``None``: the setting's own Hub id (`TaskSpec.dataset`).
* an existing local folder: an offline copy in this layout (parquet or JSON lines)::

      <root>/<config>/<split>.parquet     one file per config and split (.jsonl also read)
      <root>/<split>.parquet              where the spec has no subset (TaskSpec.subset is None)

  For ``subset == ALL_CONFIGS`` the configs are the sub-folders of ``<root>`` holding a file for
  one of the spec's splits, in sorted order (so media folders such as ``videos/`` next to them
  are not configs). Parquet written by `datasets` keeps its features, so ``Image`` columns
  load exactly as from the Hub.
* anything else that reads ``org/name`` (`zppo_trl.data.is_hub_id`): a Hub dataset id, e.g. a
  mirror of the upstream dataset. Any other name is a missing local path: FileNotFoundError.

What the rows carry: every upstream column, image columns left encoded (``{"bytes", "path"}``
dicts; HLE's base64 ``data:`` strings as they are): `zppo_trl.evaluation.media.load_image`
decodes each when its request is built, so a suite's images are not all held in memory at once
and one unreadable image skips its own item instead of failing the load. Plus ``_id``
(``"<config>/<split>/<index>"``, or ``"<split>/<index>"`` without a subset; the index is the
row's position in that split's file before `TaskSpec.row_filter`, so it is stable under
filtering and `max_samples`), ``_config`` and ``_split``. Video settings add ``_video_path``
and settings with subtitles (VMME-S) ``_subtitle_path`` (a ``str`` path, or None where the file
is not there: a missing video skips its item; a missing subtitle file is sent as "no
subtitles", since some Video-MME videos have none).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..data import is_hub_id
from .tasks import ALL_CONFIGS, SUITE, TaskSpec

__all__ = ["DATA_SUFFIXES", "load_setting", "spec_columns", "table_configs"]

logger = logging.getLogger(__name__)

DATA_SUFFIXES = (".parquet", ".jsonl")
"""Local file formats, in order of preference where both exist for one split."""

_BUILDERS = {".parquet": "parquet", ".jsonl": "json"}


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def spec_columns(spec: TaskSpec) -> tuple[list[str], list[str]]:
    """The columns a setting names, as ``(required, any_of_images)``.

    ``required``: the question, every answer alternative, the option column(s), the group,
    row-filter and video columns and the extra fields. ``any_of_images``: a tuple-valued
    `image_field` (MMMU-Pro's ``image``, ``image_1``..``image_7``), of which a table needs at
    least one (the standard configs have ``image_<i>``, the vision config ``image``); a single
    image column is required like any other.
    """
    required: list[str] = []
    for value in (spec.question_field, spec.answer_field, spec.options_field, spec.group_field,
                  spec.row_filter[0] if spec.row_filter else None, spec.video_field, spec.extra_fields):  # fmt: skip
        for column in _as_tuple(value):
            if column not in required:
                required.append(column)
    images = _as_tuple(spec.image_field)
    if len(images) == 1:
        required.append(images[0])
        images = ()
    return required, list(images)


def _validate_columns(spec: TaskSpec, columns: Iterable[str], config: str | None, split: str, where: str) -> list[str]:
    """Check a table against the spec; returns the named columns it lacks by design (filled with None)."""
    present = set(columns)
    # Columns a config does not have by upstream design: the row gets None there. An image-only
    # config (MMMU-Pro's vision) renders the question (and options) inside its one image, so it
    # has no question column.
    absent_ok = {spec.question_field} if config in spec.image_only_configs else set()
    required, any_images = spec_columns(spec)
    for column in required:
        if column not in present and column not in absent_ok:
            raise ValueError(f"{spec.name}: column {column!r} is missing from {where}; it has {sorted(present)}")
    if any_images and not present.intersection(any_images):
        raise ValueError(
            f"{spec.name}: none of the image columns {any_images} is in {where}; it has {sorted(present)}"
        )
    return [column for column in [*required, *any_images] if column not in present]


# ---------------------------------------------------------------------- sources


def _local_file(folder: Path, split: str) -> Path | None:
    for suffix in DATA_SUFFIXES:
        path = folder / f"{split}{suffix}"
        if path.is_file():
            return path
    return None


def _splits(spec: TaskSpec) -> list[str]:
    return list(_as_tuple(spec.split))


def table_configs(spec: TaskSpec, source: Path | str) -> list[str | None]:
    """The configs a setting concatenates, in order: ``[None]`` without a subset.

    For `ALL_CONFIGS`: a local folder's sub-folders holding a file for one of the spec's splits
    (sorted), or the Hub id's config names (`datasets.get_dataset_config_names`).
    """
    if spec.subset is None:
        return [None]
    if spec.subset != ALL_CONFIGS:
        return list(_as_tuple(spec.subset))
    if isinstance(source, Path):
        configs = sorted(
            child.name for child in source.iterdir()
            if child.is_dir() and any(_local_file(child, split) for split in _splits(spec))
        )  # fmt: skip
        if not configs:
            raise FileNotFoundError(
                f"{spec.name}: {source} has no config folder holding {' or '.join(_splits(spec))}"
                f"{{{','.join(DATA_SUFFIXES)}}} (layout: <root>/<config>/<split>.parquet)"
            )
        return configs
    import datasets

    return list(datasets.get_dataset_config_names(source))


def _load_local(spec: TaskSpec, root: Path, config: str | None, split: str):
    import datasets

    folder = root / config if config is not None else root
    path = _local_file(folder, split)
    if path is None:
        expected = " or ".join(str(folder / f"{split}{suffix}") for suffix in DATA_SUFFIXES)
        raise FileNotFoundError(
            f"{spec.name}: no data file for config {config!r}, split {split!r}: expected {expected}"
        )
    return datasets.load_dataset(_BUILDERS[path.suffix], data_files=str(path), split="train"), path


def _load_hub(spec: TaskSpec, dataset_id: str, config: str | None, split: str):
    import datasets

    return datasets.load_dataset(dataset_id, name=config, split=split)


def _resolve_source(spec: TaskSpec, source: str | os.PathLike | None) -> Path | str:
    """A local folder (Path) or a Hub id (str)."""
    if source is None:
        return spec.dataset
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(
                f"{spec.name}: data source {str(source)!r} is a file; expected a folder laid out as "
                "<root>/<config>/<split>.parquet (or <root>/<split>.parquet without a subset)"
            )
        return path
    if isinstance(source, str) and is_hub_id(source):
        return source
    raise FileNotFoundError(
        f"{spec.name}: data source {str(source)!r} does not exist (and is no Hub dataset id, which reads org/name)"
    )


# ---------------------------------------------------------------------- rows


def _blank_to_none(value: Any) -> Any:
    """HLE leaves its image column an empty string on text-only rows: None, like a missing image."""
    return None if isinstance(value, str) and not value.strip() else value


def _undecoded_images(dataset, columns: Sequence[str]):
    """The dataset with its ``Image`` columns left encoded (decoded per item by the prompt builder)."""
    import datasets

    for column in columns:
        if isinstance(dataset.features.get(column), datasets.Image):
            dataset = dataset.cast_column(column, datasets.Image(decode=False))
    return dataset


def _video_candidates(value: str, video_dir: Path, config: str | None) -> list[Path]:
    candidates = []
    if os.path.isabs(value):
        candidates.append(Path(value))
    if "://" in value:  # a URL (MMVU): the path inside the dataset repo, then the file name
        tail = value.split("://", 1)[1]
        if "/resolve/" in tail:
            candidates.append(video_dir / tail.split("/resolve/", 1)[1].split("/", 1)[-1])
        candidates.append(video_dir / tail.rsplit("/", 1)[-1])
    else:
        candidates += [video_dir / value, video_dir / f"{value}.mp4"]
        if config is not None:
            candidates += [video_dir / config / value, video_dir / config / f"{value}.mp4"]
    return candidates


def _find_video(value: Any, video_dir: Path | None, config: str | None) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    value = str(value).strip()
    if video_dir is None:
        return value if os.path.isabs(value) and os.path.isfile(value) else None
    for candidate in _video_candidates(value, video_dir, config):
        if candidate.is_file():
            return str(candidate)
    return None


def _select(spec: TaskSpec, tables: list[dict], max_samples: int | None) -> None:
    """Set each table's ``keep`` indices: the row filter, then the first `max_samples` rows or groups."""
    for table in tables:
        indices = range(len(table["dataset"]))
        if spec.row_filter:
            column, suffix = spec.row_filter
            values = list(table["dataset"][column])  # one column: no image is decoded
            indices = [
                i
                for i, value in zip(indices, values, strict=False)
                if isinstance(value, str) and value.endswith(suffix)
            ]
        table["keep"] = list(indices)
    if max_samples is None:
        return
    if spec.aggregation == "worst_case_variants":
        # The first N groups in spec order, each with all its variants (in whichever split).
        chosen: dict[str, None] = {}
        for table in tables:
            groups = list(table["dataset"][spec.group_field])
            for i in table["keep"]:
                if len(chosen) == max_samples:
                    break
                chosen.setdefault(str(groups[i]), None)
        for table in tables:
            groups = list(table["dataset"][spec.group_field])
            table["keep"] = [i for i in table["keep"] if str(groups[i]) in chosen]
        return
    left = max_samples
    for table in tables:
        table["keep"] = table["keep"][:left]
        left -= len(table["keep"])


def load_setting(
    spec: TaskSpec | str,
    source: str | os.PathLike | None = None,
    *,
    max_samples: int | None = None,
    video_dir: str | os.PathLike | None = None,
    subtitle_dir: str | os.PathLike | None = None,
) -> list[dict]:
    """Load one setting's rows: its configs x splits concatenated in spec order, filtered.

    Args:
        spec: a `TaskSpec` or its name in `SUITE`.
        source: None (the spec's Hub id), a Hub id ``org/name``, or a local folder in the
            layout of this module's docstring.
        max_samples: keep the first N rows (after `TaskSpec.row_filter`). For
            ``worst_case_variants`` (DynaMath) it keeps the first N groups instead, each with
            all its variants, so that the worst case over variants stays meaningful.
        video_dir: where the video files are (video settings). A row's `TaskSpec.video_field`
            value ``v`` resolves to the first file of ``<video_dir>/v``, ``<video_dir>/v.mp4``,
            ``<video_dir>/<config>/v`` (and ``.mp4``), or ``v`` itself where it is an existing
            absolute path; a URL value (MMVU) to its path inside the dataset repo
            (``videos/<subject>/<file>``) or its file name under ``video_dir``.
        subtitle_dir: where VMME-S's ``<videoID>.srt`` files are.

    Returns a list of dicts: the upstream columns (image columns encoded, as the module docstring
    says; HLE's empty string as None), plus ``_id``, ``_config``,
    ``_split``, and ``_video_path`` / ``_subtitle_path`` where the setting has video/subtitles.
    A named column a config lacks by upstream design (MMMU-Pro vision's question, the image
    columns a config does not have) is None.

    Raises ValueError for an unknown setting, a bad `max_samples`, or a table lacking a column
    the spec names (naming the setting, the column and the file or config); FileNotFoundError
    for a local source or data file that does not exist. Missing *values* are left to the
    scorers, which raise per row.
    """
    if isinstance(spec, str):
        if spec not in SUITE:
            raise ValueError(f"unknown setting {spec!r}; see zppo_trl.evaluation.tasks.SUITE")
        spec = SUITE[spec]
    if max_samples is not None and (
        isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1
    ):
        raise ValueError(f"{spec.name}: max_samples must be a positive integer or None, not {max_samples!r}")
    origin = _resolve_source(spec, source)
    local = isinstance(origin, Path)

    tables = []
    for config in table_configs(spec, origin):
        for split in _splits(spec):
            if local:
                dataset, path = _load_local(spec, origin, config, split)
                where = str(path)
            else:
                dataset = _load_hub(spec, origin, config, split)
                where = f"{origin} (config {config!r}, split {split!r})"
            absent = _validate_columns(spec, dataset.column_names, config, split, where)
            tables.append({"dataset": dataset, "config": config, "split": split, "absent": absent})

    _select(spec, tables, max_samples)
    image_columns = _as_tuple(spec.image_field)
    rows: list[dict] = []
    for table in tables:
        if not table["keep"]:
            continue
        config, split = table["config"], table["split"]
        prefix = f"{config}/{split}" if config is not None else split
        subset = _undecoded_images(table["dataset"].select(table["keep"]), image_columns)
        for index, row in zip(table["keep"], subset, strict=False):
            row = dict(row)
            for column in table["absent"]:
                row[column] = None
            for column in image_columns:
                row[column] = _blank_to_none(row.get(column))
            row.update(_id=f"{prefix}/{index}", _config=config, _split=split)
            rows.append(row)

    if spec.video_field is not None:
        _attach_media(spec, rows, video_dir, subtitle_dir)
    logger.info("%s: %d rows from %s", spec.name, len(rows), origin)
    return rows


def _attach_media(spec: TaskSpec, rows: list[dict], video_dir, subtitle_dir) -> None:
    """Add ``_video_path`` (and ``_subtitle_path`` on subtitle settings); warn once per kind with the count missing."""
    video_root = Path(video_dir).expanduser() if video_dir is not None else None
    for row in rows:
        row["_video_path"] = _find_video(row.get(spec.video_field), video_root, row["_config"])
    _warn_missing(spec, rows, "_video_path", "video file", video_root, "; they will be skipped")
    if not spec.subtitles:
        return
    subtitle_root = Path(subtitle_dir).expanduser() if subtitle_dir is not None else None
    for row in rows:
        stem = row.get(spec.video_field)
        path = subtitle_root / f"{stem}.srt" if subtitle_root is not None and stem else None
        row["_subtitle_path"] = str(path) if path is not None and path.is_file() else None
    _warn_missing(spec, rows, "_subtitle_path", "subtitle file", subtitle_root, "")


def _warn_missing(spec: TaskSpec, rows: list[dict], key: str, what: str, root: Path | None, consequence: str) -> None:
    """One warning with how many rows have no ``what`` (their ``key`` is None)."""
    missing = sum(row[key] is None for row in rows)
    if missing:
        where = f" under {root}" if root else f" (no {key[1:].replace('_path', '_dir')} given)"
        logger.warning("%s: %d of %d rows have no %s%s%s", spec.name, missing, len(rows), what, where, consequence)
