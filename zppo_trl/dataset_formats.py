"""The training set's format, decided once: ZPPO's schema or TRL's prompt-only formats.

:class:`zppo_trl.ZPPOTrainer` takes what ``GRPOTrainer`` takes. A training set is in one of three formats:

* ``zppo``: the schema of :mod:`zppo_trl.data` (``id``, ``question`` without the closer, ``images``, ``answer``),
  what the ZPPO-77K builder writes. Its prompt is one user turn: images, question, block, closer.
* ``standard``: TRL's standard prompt-only format, a ``prompt`` text (and ``image``/``images`` where present).
  The prompt is that text with the block and the closer appended; it reaches the student as text, as TRL sends
  a standard prompt, except where the row has images: those need a chat turn for the processor to place them,
  so the text becomes one user turn (TRL itself refuses images in the standard format).
* ``conversational``: TRL's conversational prompt-only format, ``prompt`` messages. The system and earlier turns
  are kept; the block and the closer go at the end of the text of its last user turn.

The question is the standard prompt's text or the last user turn's text; the images are ``images`` (a list) or
``image`` (one). A TRL dataset without an ``id`` column gets one from the row index (``"0"``, ``"1"``, ...), which
checkpoints and the replay buffer key on: a resumed run given the same dataset finds the same rows.

Reward functions receive prompts and completions in the dataset's own format, as TRL gives them: strings for a
standard dataset, message lists for the other two (:meth:`DatasetFormat.for_rewards`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import data
from .prompts import compose_prompt
from .rewards import completion_text

__all__ = [
    "CONVERSATIONAL",
    "STANDARD",
    "ZPPO",
    "DatasetFormat",
    "dataset_format",
    "prepare_datasets",
    "prepare_train_dataset",
    "reward_columns",
]

ZPPO = "zppo"
STANDARD = "standard"
CONVERSATIONAL = "conversational"

PROMPT = "prompt"  # TRL's prompt column
IMAGE = "image"  # TRL's one-image column (``images`` holds a list)

# What TRL passes every reward function besides the dataset's columns: never a column a dataset must have.
_TRL_REWARD_ARGUMENTS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


@dataclass(frozen=True)
class DatasetFormat:
    """How one training set's rows become prompts (:data:`ZPPO`, :data:`STANDARD` or :data:`CONVERSATIONAL`)."""

    kind: str
    has_images: bool = False  # the dataset has an image column

    @property
    def messages_for_rewards(self) -> bool:
        """Whether reward functions receive message lists (else strings)."""
        return self.kind != STANDARD

    @property
    def chats(self) -> bool:
        """Whether prompts reach the student as chats: all but a standard dataset without images, whose texts go
        as they are (one answer per dataset, so that a batch never mixes the two)."""
        return self.kind != STANDARD or self.has_images

    def question(self, row: Mapping) -> str:
        """The question's text, without block or closer."""
        if self.kind == ZPPO:
            return row[data.QUESTION]
        if self.kind == STANDARD:
            return row[PROMPT]
        return _text_of(_last_user_turn(row[PROMPT])["content"])

    def images(self, row: Mapping) -> list:
        """The row's images (an empty list for a text-only row)."""
        if data.IMAGES in row:
            return list(row[data.IMAGES] or [])
        image = row.get(IMAGE)
        return [] if image is None else [image]

    def prompt(self, row: Mapping, block: str | None, closer: str | None) -> str | list[dict]:
        """TRL's ``prompt`` for ``row``: the question, then ``block``, then ``closer``, in the dataset's format
        (a text only for a text-only standard row: the others are chats)."""
        text = compose_prompt(self.question(row), block, closer)
        if self.kind == CONVERSATIONAL:
            return _with_last_user_text(row[PROMPT], text)
        if not self.chats:
            return text
        return [{"role": "user", "content": text}]

    def chat(self, row: Mapping, text: str | None, closer: str | None) -> list[dict]:
        """A chat for the teacher's server, images in the first user turn as TRL places them: the student's plain
        prompt (a conversational row's system and earlier turns kept) or, given ``text``, one user turn of it."""
        from trl.data_utils import prepare_multimodal_messages

        if text is None and self.kind == CONVERSATIONAL:
            messages = self.prompt(row, None, closer)
        else:
            text = compose_prompt(self.question(row), None, closer) if text is None else text
            messages = [{"role": "user", "content": text}]
        images = self.images(row)
        return prepare_multimodal_messages(messages, images) if images else messages

    def for_rewards(self, prompts: Sequence, completions: Sequence) -> tuple[list, list]:
        """``prompts`` and ``completions`` as a reward function of this format expects them: a standard row's
        chat (it had images) back to its text."""
        if self.messages_for_rewards:
            return list(prompts), list(completions)
        return [completion_text(p) for p in prompts], [completion_text(c) for c in completions]


def _last_user_turn(messages: Sequence[Mapping]) -> Mapping:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message
    raise ValueError("the prompt has no user turn")


def _text_of(content: Any) -> str:
    """A message's text: its string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("type") == "text")


def _with_last_user_text(messages: Sequence[Mapping], text: str) -> list[dict]:
    """``messages`` with the last user turn's text replaced by ``text`` (its image parts kept, in place)."""
    position = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    turn = messages[position]
    content = turn["content"]
    if isinstance(content, str):
        content = text
    else:
        first = next(i for i, part in enumerate(content) if part.get("type") == "text")
        content = [
            {"type": "text", "text": text} if i == first else part
            for i, part in enumerate(content)
            if i == first or part.get("type") != "text"
        ]
    return [*messages[:position], {**turn, "content": content}, *messages[position + 1 :]]


# ---------------------------------------------------------------------- deciding the format


def dataset_format(dataset: Any) -> DatasetFormat:
    """The format of ``dataset`` (a ``datasets.Dataset`` or ``IterableDataset``): TRL's where it has a ``prompt``
    column (conversational where that holds messages), ZPPO's where it has ``question``."""
    columns = _columns(dataset)
    if PROMPT in columns:
        first = _first_row(dataset)
        if first is None:
            raise ValueError("train_dataset is empty")
        kind = CONVERSATIONAL if isinstance(first[PROMPT], list) else STANDARD
        return DatasetFormat(kind, has_images=IMAGE in columns or data.IMAGES in columns)
    if data.QUESTION in columns:
        return DatasetFormat(ZPPO, has_images=True)
    raise ValueError(
        f"train_dataset has neither a {PROMPT!r} column (TRL's prompt-only formats) nor a {data.QUESTION!r} column "
        f"(the schema of zppo_trl.data); its columns are {sorted(columns)}"
    )


def _columns(dataset: Any) -> list[str]:
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # an IterableDataset whose features are unknown until read
        first = _first_row(dataset)
        columns = list(first) if first is not None else []
    return list(columns)


def _first_row(dataset: Any) -> Mapping | None:
    if _is_iterable(dataset):
        return next(iter(dataset), None)
    return dataset[0] if len(dataset) else None


def _is_iterable(dataset: Any) -> bool:
    import datasets

    return isinstance(dataset, datasets.IterableDataset)


def reward_columns(func: Callable) -> list[str]:
    """The dataset columns ``func`` names as parameters without a default (TRL passes every column by name):
    the columns a dataset must have for it."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return []
    return [
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is p.empty
        and p.name not in _TRL_REWARD_ARGUMENTS
    ]


# ---------------------------------------------------------------------- the training set, prepared


def prepare_train_dataset(
    dataset: Any, required: Mapping[str, Sequence[str]], *, lookups: str | None
) -> tuple[Any, DatasetFormat, dict[Any, int] | None]:
    """Check ``dataset`` for the trainer and give TRL rows their ids: ``(dataset, format, {id: row index})``.

    ``required`` maps a column the run reads to what reads it (the reward functions, a row's parts); a column
    missing is an error naming both. A map-style dataset is checked row by row (every prompt a non-empty text
    or messages with a user turn; unique ids) and indexed by id. A streaming dataset (``IterableDataset``) is
    checked as it is read, and refused where ``lookups`` says what would look an earlier question up by id
    (the replay buffer).
    """
    if dataset is None:
        raise ValueError("ZPPOTrainer needs a train_dataset")
    import datasets

    if not isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
        raise ValueError(f"train_dataset must be a datasets.Dataset or IterableDataset, got {type(dataset).__name__}")
    fmt = dataset_format(dataset)
    columns = _columns(dataset)
    needed = [data.QUESTION, data.IMAGES] if fmt.kind == ZPPO else []
    for column in needed:
        if column not in columns:
            raise ValueError(
                f"train_dataset is missing column {column!r}; expected the schema of zppo_trl.data "
                f"{list(data.COLUMNS)} or TRL's prompt-only formats"
            )
    for column, readers in required.items():
        if column not in columns and not (column == data.ID and fmt.kind != ZPPO):  # TRL rows get their ids here
            raise ValueError(
                f"train_dataset has no {column!r} column, which {' and '.join(readers)} "
                f"{'reads' if len(readers) == 1 else 'read'}; add it, or use reward functions that do not read it "
                f"(columns: {sorted(columns)})"
            )
    if _is_iterable(dataset):
        if lookups:
            raise ValueError(
                f"train_dataset is a streaming IterableDataset, but {lookups} needs questions of earlier steps by "
                "id, which a stream cannot give: pass a map-style datasets.Dataset, or train a row without the "
                "buffer (replay_fraction: 0)"
            )
        if data.ID not in columns:
            dataset = dataset.map(lambda _, index: {data.ID: str(index)}, with_indices=True)
        if fmt.kind != ZPPO:
            dataset = dataset.map(lambda row, index: _check_prompt(row[PROMPT], fmt, index) or {}, with_indices=True)
        return dataset, fmt, None
    if data.ID not in columns:  # TRL's formats: the row index, stable as long as the dataset is
        if fmt.kind == ZPPO:
            raise ValueError(f"train_dataset is missing column {data.ID!r}; ids key the replay buffer")
        dataset = dataset.add_column(data.ID, [str(i) for i in range(len(dataset))])
    if fmt.kind != ZPPO:
        for index, prompt in enumerate(dataset[PROMPT]):
            _check_prompt(prompt, fmt, index)
    return dataset, fmt, _index(dataset[data.ID])


def _check_prompt(prompt: Any, fmt: DatasetFormat, index: int) -> None:
    """Raise ``ValueError`` naming the row when ``prompt`` is not one of ``fmt``'s."""
    if fmt.kind == STANDARD:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"train_dataset row {index}: {PROMPT!r} must be a non-empty text, got {prompt!r:.80}")
        return
    if not isinstance(prompt, list) or not all(isinstance(m, Mapping) and "role" in m for m in prompt):
        raise ValueError(f"train_dataset row {index}: {PROMPT!r} must be a list of messages, got {prompt!r:.80}")
    try:
        turn = _last_user_turn(prompt)
    except ValueError:
        raise ValueError(
            f"train_dataset row {index}: {PROMPT!r} has no user turn for the question (roles: "
            f"{[m['role'] for m in prompt]})"
        ) from None
    content = turn.get("content")
    if not isinstance(content, (str, list)) or not _text_of(content).strip():
        raise ValueError(f"train_dataset row {index}: the last user turn of {PROMPT!r} has no text")


def _index(ids: Sequence[Any]) -> dict[Any, int]:
    seen: dict[Any, int] = {}
    for i, key in enumerate(ids):
        if key in seen:
            raise ValueError(
                f"train_dataset rows {seen[key]} and {i}: duplicate id {key!r}; ids key the replay buffer and "
                "must be unique"
            )
        seen[key] = i
    return seen


def prepare_datasets(train_dataset: Any, eval_dataset: Any, reward_funcs: Any, args: Any):
    """What :class:`zppo_trl.ZPPOTrainer` makes of its datasets: :func:`prepare_train_dataset` with the columns the
    reward functions and the row's parts read (:func:`columns_read`) and the replay buffer's lookups where the row
    replays, and the evaluation set checked to be in the training set's format."""
    lookups = f"the replay buffer (replay_fraction={args.replay_fraction})" if args.replay_fraction > 0 else None
    prepared = prepare_train_dataset(train_dataset, columns_read(reward_funcs, args), lookups=lookups)
    _check_eval_format(eval_dataset, prepared[1])
    return prepared


def columns_read(reward_funcs: Any, args: Any) -> dict[str, list[str]]:
    """The dataset columns a run reads, each with what reads it: the reward functions' named parameters
    (:func:`reward_columns`) and the gold answers where the row's parts read them (``Needs.gold_answers``)."""
    from .rewards import boxed_accuracy_reward
    from .row import row_name

    read: dict[str, list[str]] = {}
    for func in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
        name = getattr(func, "__name__", type(func).__name__)
        default = " (the default reward)" if func is boxed_accuracy_reward else ""
        for column in reward_columns(func):
            read.setdefault(column, []).append(f"the reward function {name}{default}")
    if args.row.needs.gold_answers:
        read.setdefault(data.ANSWER, []).append(f"the {row_name(args)} row")
    return read


def _check_eval_format(eval_dataset: Any, train_format: DatasetFormat) -> None:
    """An evaluation set is rendered as the training set is: its format must be the same."""
    if eval_dataset is None:
        return
    named = eval_dataset.items() if isinstance(eval_dataset, Mapping) else [("eval_dataset", eval_dataset)]
    for name, dataset in named:
        found = dataset_format(dataset)
        if found != train_format:
            raise ValueError(
                f"{name} is in the {found.kind} format but train_dataset in the {train_format.kind} format; "
                "evaluation prompts are rendered as training prompts: give both in one format"
            )
