"""The evaluation condition a checkpoint carries: how training records it and how ``zppo-eval run`` finds it.

A row whose checkpoint the paper evaluates off the shared prompt (Correction-SFT: ``<correct>`` before
the closer, the tag its corrections trained under) says so in its own ``config.json``, under
:data:`CONDITION_KEY`. The trainer writes it into the model's config (:func:`record_condition`), so it
goes wherever the model goes: every checkpoint, ``save_pretrained``, ``push_to_hub``, and the
directory ``vllm serve`` loads. ``zppo-eval run`` reads it back (:func:`resolve_condition`) from
``--checkpoint DIR`` or, without one, from the directory the student endpoint serves (the ``root``
vLLM reports in ``/v1/models``, or the served model name where that is a local directory, as
``transformers serve`` names models), and applies it unless ``--condition`` says otherwise.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

__all__ = [
    "CONDITION_KEY",
    "NO_CONDITION",
    "ResolvedCondition",
    "checkpoint_condition",
    "record_condition",
    "resolve_condition",
    "served_checkpoint",
]

logger = logging.getLogger(__name__)

CONDITION_KEY = "zppo_evaluation_condition"
NO_CONDITION = "none"  # `--condition none`: the shared prompt, whatever the checkpoint records


def record_condition(config: Any, condition: str | None) -> None:
    """Record ``condition`` in a model's ``config`` (a transformers ``PretrainedConfig``, saved as its
    ``config.json``); None removes one a checkpoint of another row carried in, so a model trained
    further under the shared prompt is not evaluated under a stale condition."""
    if condition is not None:
        setattr(config, CONDITION_KEY, condition)
    elif hasattr(config, CONDITION_KEY):
        delattr(config, CONDITION_KEY)


def checkpoint_condition(directory: str | Path) -> str | None:
    """The condition ``directory/config.json`` records (None: it records none, the shared prompt).

    Raises ValueError naming the file where it is missing or is not a JSON object."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable config.json ({type(err).__name__}: {err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    condition = config.get(CONDITION_KEY)
    if condition is not None and not isinstance(condition, str):
        raise ValueError(f"{path}: {CONDITION_KEY} must be a string, got {condition!r}")
    return condition


def _has_config(name: str | None) -> bool:
    return bool(name) and (Path(name) / "config.json").is_file()


def served_checkpoint(listing: Any, model: str) -> tuple[Path | None, str]:
    """The local directory an endpoint serves ``model`` from, given its ``/v1/models`` reply ``listing``
    (None where it could not be read): ``(directory, how it was found)``, or ``(None, why not)``.

    vLLM lists each served model with its ``root``, the path or Hub id it loaded (``--served-model-name``
    only renames the ``id``). ``transformers serve`` lists no ``root`` (it names models by their path), so
    the served model name itself is tried next. Only a directory holding a ``config.json`` counts.
    """
    entries = listing.get("data") if isinstance(listing, dict) else None
    entry = next((e for e in entries or () if isinstance(e, dict) and e.get("id") == model), None)
    root = entry.get("root") if entry else None
    if _has_config(root):
        return Path(root), f"the root of {model!r} in the endpoint's /v1/models"
    if _has_config(model):
        return Path(model), "the served model name, a local directory"
    if root:
        why = f"the endpoint serves {model!r} from {root!r}, which is not a local directory with a config.json"
    elif entry:
        why = f"the endpoint's /v1/models lists {model!r} without a root, and the name is not a local directory"
    elif listing is None:
        why = f"{model!r} is not a local directory and the endpoint's /v1/models could not be read"
    else:
        why = f"the endpoint's /v1/models does not list {model!r}, and the name is not a local directory"
    return None, why


def _list_models(base_url: str, api_key: str | None, timeout: float) -> Any:
    """The endpoint's ``/v1/models`` reply as JSON, or None (logged) where it cannot be had."""
    # the raw reply: openai's Model type does not declare vLLM's `root`
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=1)
    try:
        return client.models.with_raw_response.list().http_response.json()
    except (openai.OpenAIError, ValueError) as err:
        logger.info("cannot read %s/models (%s: %s)", base_url.rstrip("/"), type(err).__name__, err)
        return None
    finally:
        client.close()


@dataclass(frozen=True)
class ResolvedCondition:
    """The condition a run uses (None: the shared prompt) and where it came from, in words."""

    condition: str | None
    source: str


def resolve_condition(
    flag: str | None,
    checkpoint: str | Path | None,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> ResolvedCondition:
    """The condition of a run: ``flag`` (``--condition``; ``"none"`` for the shared prompt) where given,
    else the one the checkpoint records.

    The checkpoint is ``checkpoint`` (``--checkpoint``; a directory without a readable config.json
    raises ValueError) or, without one, the directory the endpoint serves ``model`` from
    (:func:`served_checkpoint`). A checkpoint that cannot be located leaves the shared prompt, with a
    warning that the condition was not checked; never an error. An explicit ``flag`` that differs from
    what the checkpoint records is logged, and wins.
    """
    if checkpoint is not None:
        located, found = Path(checkpoint), "--checkpoint"
        recorded = checkpoint_condition(located)
    else:
        located, found = served_checkpoint(_list_models(base_url, api_key, timeout), model)
        recorded = None
        if located is not None:
            try:
                recorded = checkpoint_condition(located)
            except ValueError as err:
                located, found = None, str(err)
    where = f"{located / 'config.json'} ({found})" if located is not None else None
    if flag is not None:
        condition = None if flag.strip().lower() == NO_CONDITION else flag
        if where is not None and recorded != condition:
            logger.warning("--condition %r overrides the condition %r recorded in %s", flag, recorded, where)
        return ResolvedCondition(condition, "--condition" if condition is not None else f"--condition {NO_CONDITION}")
    if where is None:
        logger.warning(
            "the checkpoint behind %r could not be located (%s), so its evaluation condition could not be checked: "
            "evaluating under the shared prompt; pass --checkpoint DIR, or --condition '<correct>' for a "
            "Correction-SFT checkpoint",
            model,
            found,
        )
        return ResolvedCondition(None, f"not checked: the checkpoint could not be located ({found})")
    return ResolvedCondition(recorded, f"{'recorded' if recorded else 'none recorded'} in {where}")
