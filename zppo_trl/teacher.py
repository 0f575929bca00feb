"""The teacher and the judge: an OpenAI-compatible client for sampling, compression and judging.

ZPPO's frozen teacher is only ever prompt text: it samples G_T answers per question,
rewrites candidates under the compression prompt (the paper's compression prompt) and, as
the shared judge (the paper's shared judge prompt), grades free-form answers. In production
it is ``vllm serve``; any OpenAI-compatible ``/v1/chat/completions`` endpoint works.

:class:`TeacherClient` runs ``openai.AsyncOpenAI`` on a private event-loop thread and
exposes synchronous batch methods (``sample``, ``compress``, ``judge``) plus their
non-blocking forms (``sample_async`` ...), which return a ``concurrent.futures.Future``
so the trainer can start teacher work before the student's rollouts and collect it
afterwards. Requests are bounded by a semaphore, each attempt by a timeout, and failed
attempts are retried with exponential backoff and jitter. A server fault never raises:
the affected results come back short (sample), None (compress) or wrong (judge), and
:meth:`TeacherClient.stats` counts what happened. Bad arguments raise ``ValueError``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai

from zppo_trl.prompts import render_compression, render_hint, render_judge
from zppo_trl.rewards import extract_boxed

logger = logging.getLogger(__name__)

__all__ = [
    "COMPRESSION_MAX_TOKENS",
    "JUDGE_MAX_TOKENS",
    "TEACHER_MAX_TOKENS",
    "TeacherClient",
    "extract_summary",
    "image_data_url",
    "parse_verdict",
    "strip_thinking",
    "to_openai_messages",
]

# The paper's hyperparameter table and its benchmark appendix.
TEACHER_MAX_TOKENS = 12288
COMPRESSION_MAX_TOKENS = 512
JUDGE_MAX_TOKENS = 512

# 4xx statuses worth another attempt; every 5xx is retried too.
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)
_SUMMARY_TAG = re.compile(r"</?summary>")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_IMAGE_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp", "BMP": "image/bmp"}


# ---------------------------------------------------------------- pure helpers


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


# ---------------------------------------------------------------- argument checks


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_float(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bounds = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"{name} must be a number {bounds}, got {value!r}")
    return float(value)


def _check_list(name: str, value: Any) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a list, got {type(value).__name__}")
    return list(value)


def _check_extra_body(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"extra_body must be a dict, got {type(value).__name__}")
    return dict(value)


# ---------------------------------------------------------------- the client


class TeacherClient:
    """Batch client for the teacher (and judge) behind an OpenAI-compatible endpoint.

    Args:
        base_url: the server's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (``vllm serve``'s model id, or ``--served-model-name``).
        api_key: the key itself; prefer ``api_key_env``. Without either, a placeholder
            is sent (vLLM without ``--api-key`` accepts any key).
        max_concurrency: requests in flight at once (an ``n``-choice request counts once).
        timeout: seconds one attempt may take (connecting, waiting, reading).
        max_retries: further attempts after a failed one (connection errors, timeouts,
            HTTP 408/409/425/429 and 5xx; other 4xx fail at once).
        api_key_env: name of the environment variable holding the key. The key is
            never logged and never in ``repr``.
        extra_body: JSON merged into every request body, e.g.
            ``{"chat_template_kwargs": {"enable_thinking": False}}``; each method's own
            ``extra_body`` is merged over it.
        backoff_base, backoff_max: the wait before retry k is
            ``min(backoff_max, backoff_base * 2**(k-1))`` scaled by a random factor in
            [0.5, 1] (and at least a server's ``Retry-After``, capped at ``backoff_max``).

    Results come back in input order, one per input. Call :meth:`close` (or use the
    client as a context manager) to stop its event-loop thread.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        max_concurrency: int = 32,
        timeout: float = 600.0,
        max_retries: int = 3,
        *,
        api_key_env: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        role: str = "teacher",
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.role = role  # what the endpoint is to the run ("teacher", "judge"), for its messages
        self.max_concurrency = _check_int("max_concurrency", max_concurrency, 1)
        self.timeout = _check_float("timeout", timeout, 0.0, low_open=True)
        self.max_retries = _check_int("max_retries", max_retries, 0)
        self.backoff_base = _check_float("backoff_base", backoff_base, 0.0)
        self.backoff_max = _check_float("backoff_max", backoff_max, 0.0)
        self.extra_body = _check_extra_body(extra_body)
        if api_key is None and api_key_env is not None:
            if not isinstance(api_key_env, str) or not api_key_env:
                raise ValueError(f"api_key_env must be an environment variable name, got {api_key_env!r}")
            api_key = os.environ.get(api_key_env)
            if api_key is None:
                logger.info("%s is not set; sending requests without an API key", api_key_env)
        self._api_key = api_key
        self._rng = random.Random()
        self._n_honored: bool | None = None  # whether the server returns n choices per request
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._stats = self._zero_stats()

    @classmethod
    def from_config(cls, args: Any, role: str = "teacher") -> TeacherClient:
        """The client a :class:`zppo_trl.ZPPOConfig` describes: its teacher, or with
        ``role="judge"`` its judge endpoint (same concurrency, timeout and API key)."""
        if role not in ("teacher", "judge"):
            raise ValueError(f"role must be 'teacher' or 'judge', got {role!r}")
        return cls(
            getattr(args, f"{role}_base_url"),
            getattr(args, f"{role}_model"),
            max_concurrency=args.teacher_max_concurrency,
            timeout=args.teacher_timeout,
            api_key_env=args.teacher_api_key_env,
            extra_body=getattr(args, f"{role}_extra_body"),
            role=role,
        )

    def __repr__(self) -> str:
        key = "<set>" if self._api_key else None
        return (
            f"TeacherClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key}, "
            f"max_concurrency={self.max_concurrency}, timeout={self.timeout}, max_retries={self.max_retries})"
        )

    # ------------------------------------------------------------ public: batch methods

    def sample(
        self,
        conversations: Sequence[Any],
        n: int = 4,
        max_tokens: int = TEACHER_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
        errors: list | None = None,
        reasoning: bool = True,
    ) -> list[list[str]]:
        """``n`` sampled replies per conversation; fewer, possibly none, where the server failed.

        Asks for ``n`` choices in one request; where the server returns fewer
        (``transformers serve`` ignores ``n``), the rest come from parallel single
        requests, and once a server has been seen to ignore ``n`` every later sample is
        sent as ``n`` parallel single requests. Conversations are OpenAI message lists
        (see :func:`to_openai_messages` for images) or prompt strings. A list passed as ``errors``
        is filled with one entry per conversation: None where all its replies came, else its last
        error, starting ``"rejected: "`` where the server refused it as a client error (a bad or
        too long request: retrying cannot help). Where the server splits a reasoning trace out of the reply, it
        is put back in front (:func:`reply_text`); ``reasoning=False`` keeps the reply's content alone (what a
        judge's verdict is parsed from).
        """
        return self.sample_async(
            conversations, n, max_tokens, temperature, top_p, extra_body=extra_body, errors=errors, reasoning=reasoning
        ).result()

    def sample_async(
        self,
        conversations: Sequence[Any],
        n: int = 4,
        max_tokens: int = TEACHER_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
        errors: list | None = None,
        reasoning: bool = True,
    ) -> concurrent.futures.Future:
        """:meth:`sample` without blocking: a Future of its result (arguments are checked now)."""
        conversations = _check_list("conversations", conversations)
        messages = [to_openai_messages(c, f"conversations[{i}]") for i, c in enumerate(conversations)]
        params = self._params(max_tokens, temperature, top_p, extra_body, reasoning)
        _check_int("n", n, 1)
        return self._submit(self._sample(messages, n, params, errors))

    def compress(
        self,
        texts: Sequence[str],
        max_tokens: int = COMPRESSION_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> list[str | None]:
        """Each text rewritten under the paper's compression prompt (512-token cap).

        Thinking is removed from each reply; the result is the text inside
        ``<summary>...</summary>``, else the rest of the reply stripped (counted as
        ``untagged`` in :meth:`stats`), and None where the request failed or nothing
        usable is left (a reply cut off inside its thinking, or empty; ``unusable``).
        Serve a thinking teacher with thinking off for this call, e.g.
        ``extra_body={"chat_template_kwargs": {"enable_thinking": False}}``, so the cap is
        spent on the summary.
        """
        return self.compress_async(texts, max_tokens, temperature, top_p, extra_body=extra_body).result()

    def compress_async(
        self,
        texts: Sequence[str],
        max_tokens: int = COMPRESSION_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future:
        """:meth:`compress` without blocking: a Future of its result."""
        texts = _check_list("texts", texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"texts[{i}] must be a string, got {type(text).__name__}")
        params = self._params(max_tokens, temperature, top_p, extra_body)
        return self._submit(self._compress(texts, params))

    def hint_async(
        self,
        responses: Sequence[str],
        max_tokens: int = COMPRESSION_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future:
        """A Future of one hint per solved response (the Hint baseline, under the paper's hint prompt).

        Each result is the reply with its thinking removed, stripped; None where the request
        failed or nothing is left (counted as ``unusable``). Whether a hint is answer-free is
        the caller's check (:class:`zppo_trl.augmentations.TeacherHint`).
        """
        responses = _check_list("responses", responses)
        for i, text in enumerate(responses):
            if not isinstance(text, str):
                raise ValueError(f"responses[{i}] must be a string, got {type(text).__name__}")
        params = self._params(max_tokens, temperature, top_p, extra_body)
        return self._submit(self._hint(responses, params))

    def sequence_logprobs_async(
        self, sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int], top_k: int
    ) -> concurrent.futures.Future:
        """A Future of the teacher's top-``top_k`` next-token log-probs at every completion position of each
        token sequence (prompt then completion), teacher-forced: the distillation rows' teacher signal.

        Each sequence is one ``/v1/completions`` request with the token ids as its prompt, ``max_tokens=1``
        and vLLM's ``prompt_logprobs=top_k`` (the server's ``--max-logprobs`` must be at least ``top_k``;
        vLLM's default is 20). Position ``j`` of a result is the distribution that predicts completion token
        ``j``: ``(token_ids, logprobs)``, each ``top_k`` long in rank order. A sequence whose request failed
        gives None (counted ``failed``, the last error logged): a server that refuses ``top_k`` (HTTP 400) or
        sends no ``prompt_logprobs`` (one that is not vLLM, named in the error) fails every request.
        """
        k = _check_int("top_k", top_k, 1)
        sequences, prompt_lengths = _check_sequences(sequences, prompt_lengths)

        def read(positions: list, sequence: list[int]):
            ranked = [_top_k(position, k) for position in positions]
            return [ids for ids, _ in ranked], [logps for _, logps in ranked]

        return self._submit(self._sequence_logprobs(sequences, prompt_lengths, k, read))

    def token_logprobs_async(
        self, sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int]
    ) -> concurrent.futures.Future:
        """A Future of the teacher's log-prob of each completion token of each token sequence (prompt then
        completion) given the tokens before it, teacher-forced: what the hybrid RL rows (KDRL, RLAD) read.

        As :meth:`sequence_logprobs_async`, one ``/v1/completions`` request per sequence with vLLM's
        ``prompt_logprobs`` (1: vLLM always adds the actual token's entry); a result is one float per completion
        token, or None where the request failed (counted ``failed``, the last error logged).
        """
        sequences, prompt_lengths = _check_sequences(sequences, prompt_lengths)

        def read(positions: list, sequence: list[int]):
            return [_actual(position, token) for position, token in zip(positions, sequence[-len(positions) :])]

        return self._submit(self._sequence_logprobs(sequences, prompt_lengths, 1, read))

    def judge(
        self,
        items: Sequence[Mapping[str, Any]],
        max_tokens: int = JUDGE_MAX_TOKENS,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> list[bool | None]:
        """The shared judge's verdict per item: True only for ``{"verdict": "correct"}``.

        Items are dicts with ``question``, ``response``, ``ground_truth`` and optional
        ``options``. The judge reads the response's last ``\\boxed{}`` span where one
        parses, else the full response. Decoding: temperature 0, top-p 1, 512 tokens.
        An unparseable verdict is False (the judge answered); a request that failed after its
        retries is None: no verdict, which is not a wrong answer.
        """
        return self.judge_async(items, max_tokens, extra_body=extra_body).result()

    def judge_async(
        self,
        items: Sequence[Mapping[str, Any]],
        max_tokens: int = JUDGE_MAX_TOKENS,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future:
        """:meth:`judge` without blocking: a Future of its result."""
        prompts = []
        for i, item in enumerate(_check_list("items", items)):
            if not isinstance(item, Mapping) or any(k not in item for k in ("question", "response", "ground_truth")):
                raise ValueError(f"items[{i}] must be a dict with 'question', 'response' and 'ground_truth'")
            if not isinstance(item["response"], str) or not isinstance(item["question"], str):
                raise ValueError(f"items[{i}]: 'question' and 'response' must be strings")
            span = extract_boxed(item["response"])
            prompts.append(
                render_judge(
                    item["question"],
                    span if span is not None else item["response"],
                    str(item["ground_truth"]),
                    item.get("options"),
                )
            )
        params = self._params(max_tokens, 0.0, 1.0, extra_body, reasoning=False)  # the verdict is the content
        return self._submit(self._judge(prompts, params))

    # ------------------------------------------------------------ public: health, stats, lifetime

    def health(self, timeout: float | None = None) -> bool:
        """Whether the endpoint serves chat completions for ``model`` (one 1-token request).

        False, with the reason logged as a warning, for an unreachable server, a wrong
        path, a model the server does not serve, or a non-OpenAI reply. Not retried and
        not counted in :meth:`stats`.
        """
        reason = self.unhealthy_reason(timeout)
        if reason is not None:
            logger.warning("%s endpoint %s (model %s) is not healthy: %s", self.role, self.base_url, self.model,
                           reason)  # fmt: skip
        return reason is None

    def unhealthy_reason(self, timeout: float | None = None) -> str | None:
        """What :meth:`health` checks, without the warning: why the endpoint does not serve ``model``, or None."""
        limit = min(self.timeout, 60.0) if timeout is None else _check_float("timeout", timeout, 0.0, low_open=True)
        return self._submit(self._probe(limit)).result()

    def stats(self, reset: bool = False) -> dict[str, float]:
        """Counters since creation (or the last reset), all numeric, for logging.

        ``requests`` started, ``succeeded``, ``failed`` (after all retries), ``retries``,
        ``in_flight``; ``replies`` received and ``top_ups`` (single requests standing in
        for ``n``); ``prompt_tokens``/``completion_tokens`` as the server reports them;
        ``latency_mean_s``/``latency_max_s`` of succeeded requests (retries included);
        ``compressed``/``untagged`` and ``unusable`` (compression replies with nothing
        left after their thinking); ``hinted`` (usable hints); ``judged``/``judged_correct``/``verdict_unparsed``.
        """
        with self._lock:
            stats = dict(self._stats)
            if reset:
                in_flight = self._stats["in_flight"]
                self._stats = self._zero_stats()
                self._stats["in_flight"] = in_flight
        total = stats.pop("latency_total_s")
        stats["latency_mean_s"] = total / stats["succeeded"] if stats["succeeded"] else 0.0
        return stats

    def close(self) -> None:
        """Cancel unfinished work, close the HTTP client and stop the event-loop thread.

        Futures still pending are cancelled. A later call starts a fresh loop and client.
        """
        with self._lock:
            loop, thread, client, pid = self._loop, self._thread, self._client, self._pid
            self._loop = self._thread = self._client = self._semaphore = None
        if loop is None or pid != os.getpid() or not loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(_shutdown(client), loop).result(timeout=10)
        except Exception:
            logger.debug("closing the HTTP client failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> TeacherClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals: plumbing

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        names = (
            "requests succeeded failed retries in_flight replies top_ups prompt_tokens completion_tokens "
            "latency_total_s latency_max_s compressed untagged unusable hinted judged judged_correct verdict_unparsed"
        )
        return dict.fromkeys(names.split(), 0)

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    def _params(
        self, max_tokens: int, temperature: float, top_p: float, extra_body: Mapping | None, reasoning: bool = True
    ) -> dict:
        return dict(
            max_tokens=_check_int("max_tokens", max_tokens, 1),
            temperature=_check_float("temperature", temperature, 0.0),
            top_p=_check_float("top_p", top_p, 0.0, 1.0, low_open=True),
            extra_body={**self.extra_body, **_check_extra_body(extra_body)},
            reasoning=bool(reasoning),
        )

    def _submit(self, coroutine) -> concurrent.futures.Future:
        """Run ``coroutine`` on the private loop (started on first use, and again after a fork)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="zppo-teacher", daemon=True)
                self._thread.start()
                self._pid = os.getpid()
                self._semaphore = asyncio.Semaphore(self.max_concurrency)
                self._client = openai.AsyncOpenAI(
                    base_url=self.base_url,
                    api_key=self._api_key or "EMPTY",
                    timeout=openai.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                    max_retries=0,  # retries are ours, so the counters are right
                )
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)) * self._rng.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay

    async def _chat(
        self, messages: list[dict], n: int, params: dict, failures: list[str]
    ) -> tuple[list[str] | None, bool]:
        """One logical chat request with retries: (reply texts or None, whether the server rejected it as a
        client error). A request that finally fails appends its last error to ``failures``."""

        async def send() -> tuple[list[str], Any]:
            response = await self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                n=n,
                max_tokens=params["max_tokens"],
                temperature=params["temperature"],
                top_p=params["top_p"],
                extra_body=params["extra_body"] or None,
            )
            texts = [reply_text(choice.message, params["reasoning"]) for choice in response.choices]
            if not texts:
                raise ValueError("the reply has no choices")
            return texts, response

        return await self._with_retries(send, failures)

    async def _with_retries(self, send, failures: list[str]) -> tuple[Any, bool]:
        """Await ``send()`` (returning ``(replies, response)``) under the concurrency limit and timeout, with
        retries and backoff: ``(replies or None, whether the server rejected it as a client error)``; the
        counters are updated and a final failure appends its last error to ``failures``."""
        self._count(requests=1, in_flight=1)
        start = time.monotonic()
        retry_after: float | None = None
        error = "no attempt"
        try:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    self._count(retries=1)
                    await asyncio.sleep(self._backoff(attempt, retry_after))
                retry_after = None
                try:
                    async with self._semaphore:
                        async with asyncio.timeout(self.timeout):
                            replies, response = await send()
                except openai.APIStatusError as err:
                    error = f"HTTP {err.status_code}: {str(err.message)[:200]}"
                    if err.status_code < 500 and err.status_code not in _RETRYABLE_STATUS:
                        self._count(failed=1)
                        failures.append(error)
                        return None, True
                    retry_after = _retry_after(err)
                except TimeoutError:
                    error = f"no reply within {self.timeout:g}s"
                except (openai.APIError, ValueError, TypeError, AttributeError, KeyError) as err:
                    error = f"{type(err).__name__}: {str(err)[:200]}"
                else:
                    usage = getattr(response, "usage", None)
                    latency = time.monotonic() - start
                    with self._lock:
                        self._stats["succeeded"] += 1
                        self._stats["replies"] += len(replies)
                        self._stats["prompt_tokens"] += getattr(usage, "prompt_tokens", 0) or 0
                        self._stats["completion_tokens"] += getattr(usage, "completion_tokens", 0) or 0
                        self._stats["latency_total_s"] += latency
                        self._stats["latency_max_s"] = max(self._stats["latency_max_s"], latency)
                    return replies, False
                logger.debug("teacher attempt %d/%d failed (%s)", attempt + 1, self.max_retries + 1, error)
            self._count(failed=1)
            failures.append(error)
            return None, False
        finally:
            self._count(in_flight=-1)

    async def _gather(self, what: str, coroutines, failures: list[str]) -> list:
        """Run a batch; one warning with the last error when some of its requests failed."""
        results = await asyncio.gather(*coroutines)
        if failures:
            logger.warning(
                "%s: %d request(s) to %s failed (last error: %s)", what, len(failures), self.base_url, failures[-1]
            )
        return list(results)

    async def _sequence_logprobs(
        self, sequences: list[list[int]], prompt_lengths: list[int], top_k: int, read: Callable
    ) -> list:
        """Each sequence's ``prompt_logprobs`` at its completion positions, turned into a result by ``read(positions,
        sequence)``; None for a sequence whose request failed."""
        failures: list[str] = []

        async def one(sequence: list[int], prompt_length: int):
            async def send():
                response = await self._client.completions.create(
                    model=self.model,
                    prompt=sequence,
                    max_tokens=1,
                    temperature=1.0,
                    extra_body={"prompt_logprobs": top_k},
                )
                positions = (response.choices[0].model_extra or {}).get("prompt_logprobs")
                if positions is None:
                    raise ValueError(
                        f"{self.base_url} returned no prompt_logprobs (the teacher's log-probs need vLLM)"
                    )
                return [read(positions[prompt_length:], sequence)], response

            replies, _ = await self._with_retries(send, failures)  # one reply: the sequence's result
            return None if replies is None else replies[0]

        return await self._gather(
            "teacher log-probs", [one(seq, n) for seq, n in zip(sequences, prompt_lengths)], failures
        )

    # ------------------------------------------------------------ internals: the three jobs

    async def _sample(
        self, conversations: list[list[dict]], n: int, params: dict, errors: list | None = None
    ) -> list[list[str]]:
        failures: list[str] = []

        async def replies_for(messages: list[dict], mine: list[str]) -> tuple[list[str], bool]:
            """(replies, whether the server rejected the conversation as a client error)."""
            replies: list[str] = []
            if n > 1 and self._n_honored is not False:
                texts, rejected = await self._chat(messages, n, params, mine)
                if texts is None and not rejected:
                    return replies, False  # the server is failing: single requests would fail too
                if texts is not None:  # (a refused n-request falls through to single requests)
                    replies = texts[:n]
                    if len(texts) < n and self._n_honored is None:
                        logger.info(
                            "%s returned %d of n=%d choices; topping up with single requests",
                            self.base_url,
                            len(texts),
                            n,
                        )
                    self._n_honored = len(texts) >= n
            missing = n - len(replies)
            if missing == 1 and n == 1:
                texts, rejected = await self._chat(messages, 1, params, mine)
                return (texts[:1] if texts else []), rejected
            if missing:
                self._count(top_ups=missing)
                singles = await asyncio.gather(*(self._chat(messages, 1, params, mine) for _ in range(missing)))
                replies += [texts[0] for texts, _ in singles if texts]
                return replies, any(rejected for _, rejected in singles)
            return replies, False

        async def one(index: int, messages: list[dict]) -> list[str]:
            mine: list[str] = []
            replies, rejected = await replies_for(messages, mine)
            failures.extend(mine)
            if errors is not None and len(replies) < n and mine:
                errors[index] = ("rejected: " if rejected else "") + mine[-1]
            return replies

        if errors is not None:
            errors[:] = [None] * len(conversations)
        return await self._gather("teacher sampling", (one(i, m) for i, m in enumerate(conversations)), failures)

    async def _compress(self, texts: list[str], params: dict) -> list[str | None]:
        failures: list[str] = []

        async def one(text: str) -> str | None:
            replies, _ = await self._chat([{"role": "user", "content": render_compression(text)}], 1, params, failures)
            if replies is None:
                return None
            summary, tagged = extract_summary(replies[0])
            if summary is None:
                self._count(unusable=1)
                return None
            self._count(compressed=1, untagged=0 if tagged else 1)
            return summary

        return await self._gather("compression", (one(t) for t in texts), failures)

    async def _hint(self, responses: list[str], params: dict) -> list[str | None]:
        failures: list[str] = []

        async def one(response: str) -> str | None:
            replies, _ = await self._chat([{"role": "user", "content": render_hint(response)}], 1, params, failures)
            if replies is None:
                return None
            hint = strip_thinking(replies[0]).strip()
            self._count(hinted=int(bool(hint)), unusable=int(not hint))
            return hint or None

        return await self._gather("hint generation", (one(r) for r in responses), failures)

    async def _judge(self, prompts: list[str], params: dict) -> list[bool | None]:
        failures: list[str] = []

        async def one(prompt: str) -> bool | None:
            replies, _ = await self._chat([{"role": "user", "content": prompt}], 1, params, failures)
            if replies is None:
                return None  # no verdict (counted as a failed request)
            verdict = parse_verdict(replies[0])
            self._count(judged=1, judged_correct=int(verdict is True), verdict_unparsed=int(verdict is None))
            return verdict is True

        return await self._gather("judging", (one(p) for p in prompts), failures)

    async def _probe(self, timeout: float) -> str | None:
        """None when one 1-token chat completion succeeds, else the reason."""
        try:
            async with asyncio.timeout(timeout):
                response = await self._client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "ping"}], max_tokens=1
                )
            if not response.choices:
                return "the reply has no choices (not an OpenAI-compatible chat endpoint?)"
            return None
        except openai.APIStatusError as err:
            hint = ""
            if err.status_code == 404 and not self.base_url.endswith("/v1"):
                hint = " (OpenAI-compatible base URLs usually end in /v1)"
            return f"HTTP {err.status_code}: {str(err.message)[:300]}{hint}"
        except openai.APIConnectionError as err:
            return f"cannot connect ({type(err).__name__}: {err})"
        except TimeoutError:
            return f"no reply within {timeout:g}s"
        except (openai.APIError, ValueError, TypeError, AttributeError) as err:
            return f"not an OpenAI-compatible reply ({type(err).__name__}: {str(err)[:200]})"


async def _shutdown(client: openai.AsyncOpenAI) -> None:
    """Cancel every other task on this loop, then close ``client``."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()


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


def reply_text(message: Any, reasoning: bool = True) -> str:
    """A chat reply's text as a server without a reasoning parser sends it: where the server split the reasoning
    trace out of ``content`` (``reasoning_content``: vLLM's ``--reasoning-parser``, ``transformers serve``), it is
    put back in front in its think tags, so that ``strip_thinking``, ``extract_summary`` and the graders see it.
    With ``reasoning=False``, the content alone: a judge's verdict, which the strict parser reads as it is."""
    content = message.content or ""
    trace = (getattr(message, "model_extra", None) or {}).get("reasoning_content") if reasoning else None
    return f"<think>{trace}</think>{content}" if trace else content


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


def _retry_after(err: openai.APIStatusError) -> float | None:
    """A server's ``Retry-After`` in seconds, where it sent one as a number."""
    try:
        return max(0.0, float(err.response.headers.get("retry-after")))
    except (TypeError, ValueError, AttributeError):
        return None
