"""What the teacher client sends and reads: conversations as OpenAI chat messages, and the replies parsed.

Outgoing, :func:`to_openai_messages` turns a prompt string or a TRL/OpenAI conversation into chat messages,
images (PIL, bytes, paths, URLs) as base64 ``image_url`` parts (:func:`image_data_url`). Incoming,
:func:`reply_text` puts a split-out reasoning trace back in front of a reply, :func:`strip_thinking` removes it,
:func:`extract_summary` reads a compression reply, :func:`parse_verdict` is the shared judge's strict parser,
and ``_top_k``/``_actual`` read vLLM's ``prompt_logprobs``. Pure functions: no network, no event loop; the
client that uses them is :class:`zppo_trl.teacher.TeacherClient`.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zppo_trl.teacher_transport import _check_int, _check_list

__all__ = [
    "extract_summary",
    "image_data_url",
    "parse_verdict",
    "reply_text",
    "strip_thinking",
    "to_openai_messages",
]

_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)
_SUMMARY_TAG = re.compile(r"</?summary>")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_IMAGE_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp", "BMP": "image/bmp"}


# ---------------------------------------------------------------- replies


class _Pairs(tuple):
    """A JSON object as its (key, value) pairs, so duplicate keys stay visible."""


def parse_verdict(text: str | None) -> bool | None:
    """The shared judge's strict parser.

    Returns True for the JSON object ``{"verdict": "correct"}``, False for
    ``{"verdict": "wrong"}`` and None for anything else (which scores wrong).
    Whitespace tolerance is JSON's own: blanks, tabs and newlines around the object and
    between its tokens are accepted; nothing else is. Code fences, prose before or after,
    extra or duplicate keys, other casing ("Correct") and other values are rejected.
    """
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return None
    if type(value) is not _Pairs or len(value) != 1:
        return None
    key, verdict = value[0]
    if key != "verdict" or not isinstance(verdict, str):
        return None
    return {"correct": True, "wrong": False}.get(verdict)


def strip_thinking(reply: str) -> str:
    """``reply`` without its reasoning.

    Closed ``<think>...</think>`` blocks are removed; text before a ``</think>`` that no
    ``<think>`` opened (a chat template that opens the block in the prompt, as Qwen3.5's
    does) is dropped; an unclosed ``<think>`` (a reply cut off at the token cap while still
    thinking) is cut from there to the end.
    """
    reply = _THINK_BLOCK.sub("", reply)
    if _THINK_CLOSE in reply:
        reply = reply[reply.rindex(_THINK_CLOSE) + len(_THINK_CLOSE) :]
    if _THINK_OPEN in reply:
        reply = reply[: reply.index(_THINK_OPEN)]
    return reply


def extract_summary(reply: str) -> tuple[str | None, bool]:
    """The compressed candidate in a compression reply, and whether it was tagged.

    Thinking is removed first (:func:`strip_thinking`). Returns the stripped text inside
    the last non-empty ``<summary>...</summary>`` pair and True; otherwise what is left,
    stripped, with any stray ``<summary>``/``</summary>`` tag removed, and False; and
    ``(None, False)`` when nothing is left: a reply that was all thinking, or cut off
    inside it, is no compression and must never become a candidate.
    """
    reply = strip_thinking(reply)
    for inner in reversed(_SUMMARY.findall(reply)):
        if inner.strip():
            return inner.strip(), True
    rest = _SUMMARY_TAG.sub("", reply).strip()
    return (rest or None), False


def reply_text(message: Any, reasoning: bool = True) -> str:
    """A chat reply's text as a server without a reasoning parser sends it: where the server split the reasoning
    trace out of ``content`` (``reasoning_content``: vLLM's ``--reasoning-parser``, ``transformers serve``), it is
    put back in front in its think tags, so that ``strip_thinking``, ``extract_summary`` and the graders see it.
    With ``reasoning=False``, the content alone: a judge's verdict, which the strict parser reads as it is."""
    content = message.content or ""
    trace = (getattr(message, "model_extra", None) or {}).get("reasoning_content") if reasoning else None
    return f"<think>{trace}</think>{content}" if trace else content


# ---------------------------------------------------------------- conversations


def image_data_url(image: Any) -> str:
    """A base64 ``data:`` URL for a PIL image (encoded as PNG) or encoded image bytes.

    Raises ``ValueError`` for bytes that are not an image PIL can read.
    """
    from PIL import Image

    if isinstance(image, Image.Image):
        if image.mode not in ("RGB", "RGBA", "L", "LA", "P", "1"):
            image = image.convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data, mime = buffer.getvalue(), "image/png"
    elif isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        try:
            with Image.open(io.BytesIO(data)) as opened:
                fmt = opened.format
        except Exception as err:  # noqa: BLE001 - PIL raises several types for junk
            raise ValueError(f"image bytes are not a readable image ({err})") from None
        mime = _IMAGE_MIME.get(fmt, f"image/{(fmt or 'png').lower()}")
    else:
        raise ValueError(f"an image must be a PIL image or bytes, got {type(image).__name__}")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _is_image(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        return False
    return isinstance(value, Image.Image)


def _url_for(value: Any, where: str) -> str:
    """A URL for an image given as a URL, a local path, a PIL image or bytes."""
    if isinstance(value, Mapping) and "url" in value:
        value = value["url"]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if value.startswith(("data:", "http://", "https://")):
            return value
        if os.path.isfile(value):
            return image_data_url(Path(value).read_bytes())
        raise ValueError(f"{where}: {value[:80]!r} is neither a URL nor an existing image file")
    if _is_image(value):
        try:
            return image_data_url(value)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    raise ValueError(f"{where}: cannot send an image of type {type(value).__name__}")


def _part(part: Any, where: str) -> Any:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if _is_image(part):
        return {"type": "image_url", "image_url": {"url": _url_for(part, where)}}
    if not isinstance(part, Mapping):
        raise ValueError(f"{where}: a content part must be a dict, a string or an image, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "image_url":
        source = part.get("image_url")
        detail = source.get("detail") if isinstance(source, Mapping) else None
        url = {"url": _url_for(source, where), **({"detail": detail} if detail else {})}
        return {"type": "image_url", "image_url": url}
    if kind == "image":  # TRL's conversational form: {"type": "image", "image": PIL | bytes | path | url}
        source = next((part[k] for k in ("image", "url", "path") if part.get(k) is not None), None)
        if source is None:
            raise ValueError(f"{where}: an image placeholder without an image; put the image in the part")
        return {"type": "image_url", "image_url": {"url": _url_for(source, where)}}
    return dict(part)  # text and any other part type go through unchanged


def to_openai_messages(conversation: Any, where: str = "conversation") -> list[dict]:
    """One conversation as OpenAI chat messages; images become base64 ``image_url`` parts.

    ``conversation`` is a prompt string (one user message) or a list of messages whose
    ``content`` is a string or a list of parts. Parts may be OpenAI parts, TRL's
    ``{"type": "image", "image": ...}``, plain strings, or PIL images / encoded bytes.
    The input is not modified. Raises ``ValueError`` (prefixed by ``where``) when
    malformed.
    """
    if isinstance(conversation, str):
        return [{"role": "user", "content": conversation}]
    if isinstance(conversation, Mapping) or not isinstance(conversation, Sequence) or not conversation:
        raise ValueError(f"{where} must be a non-empty list of messages or a prompt string")
    messages = []
    for j, message in enumerate(conversation):
        here = f"{where}[{j}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"{here} must be a dict with a 'role'")
        content = message.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str):
            content = [_part(part, f"{here}.content[{k}]") for k, part in enumerate(content)]
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"{here}.content must be a string or a list of parts")
        messages.append({**message, "content": content})
    return messages


# ---------------------------------------------------------------- teacher-forced log-probs


def _top_k(position: Mapping[str, Mapping[str, Any]] | None, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most likely tokens of one ``prompt_logprobs`` entry (vLLM adds the actual token's entry when it
    ranks lower): ``(ids, logprobs)`` in rank order."""
    if not position:
        raise ValueError("a completion position has no prompt_logprobs")
    ranked = sorted(((entry["rank"], int(token), float(entry["logprob"])) for token, entry in position.items()))
    ranked = [item for item in ranked if item[0] <= k][:k]
    if len(ranked) < k:
        raise ValueError(f"the server returned {len(ranked)} log-probs for top_k={k} (raise its --max-logprobs)")
    return [token for _, token, _ in ranked], [logprob for _, _, logprob in ranked]


def _actual(position: Mapping[str, Mapping[str, Any]] | None, token: int) -> float:
    """The log-prob of ``token`` in one ``prompt_logprobs`` entry (vLLM always includes the actual token)."""
    entry = (position or {}).get(str(token))
    if entry is None:
        raise ValueError(f"a completion position's prompt_logprobs has no entry for its token {token}")
    return float(entry["logprob"])


def _check_sequences(sequences: Any, prompt_lengths: Any) -> tuple[list[list[int]], list[int]]:
    """Token sequences and their prompt lengths, checked: every sequence has a completion token."""
    sequences = [list(map(int, seq)) for seq in _check_list("sequences", sequences)]
    prompt_lengths = [_check_int(f"prompt_lengths[{i}]", n, 1) for i, n in enumerate(prompt_lengths)]
    if len(prompt_lengths) != len(sequences):
        raise ValueError(f"{len(sequences)} sequences but {len(prompt_lengths)} prompt lengths")
    for i, (seq, n) in enumerate(zip(sequences, prompt_lengths)):
        if n >= len(seq):
            raise ValueError(f"sequences[{i}] has no completion token after its {n} prompt tokens")
    return sequences, prompt_lengths
