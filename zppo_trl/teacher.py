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

This module holds the roles' operations, each written once as its ``*_async`` form (the
blocking form waits for its Future). The plumbing is ``teacher_transport.py``
(:class:`~zppo_trl.teacher_transport.TeacherTransport`: the event loop, retries, counters,
health) and the message building and reply parsing ``teacher_messages.py``; their names
are re-exported here, where callers have always imported them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zppo_trl.prompts import render_compression, render_hint, render_judge
from zppo_trl.rewards import extract_boxed

# The message helpers callers import from here are re-exported (__all__).
from zppo_trl.teacher_messages import (
    _actual,
    _check_sequences,
    _top_k,
    extract_summary,
    image_data_url,
    parse_verdict,
    reply_text,
    strip_thinking,
    to_openai_messages,
)
from zppo_trl.teacher_transport import (
    TeacherTransport,
    _check_int,
    _check_list,
)

logger = logging.getLogger(__name__)

__all__ = [
    "COMPRESSION_MAX_TOKENS",
    "JUDGE_MAX_TOKENS",
    "TEACHER_MAX_TOKENS",
    "TeacherClient",
    "extract_summary",
    "image_data_url",
    "parse_verdict",
    "reply_text",
    "strip_thinking",
    "to_openai_messages",
]

# The paper's hyperparameter table and its benchmark appendix.
TEACHER_MAX_TOKENS = 12288
COMPRESSION_MAX_TOKENS = 512
JUDGE_MAX_TOKENS = 512


class _OnTransport:
    """A :class:`TeacherClient` attribute kept on its transport, so that reading or setting it on the client
    reads or sets the one value the requests use."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: Any, owner: type | None = None) -> Any:
        return self if client is None else getattr(client._transport, self.name)

    def __set__(self, client: Any, value: Any) -> None:
        setattr(client._transport, self.name, value)


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

    base_url = _OnTransport()
    model = _OnTransport()
    role = _OnTransport()  # what the endpoint is to the run ("teacher", "judge"), for its messages
    max_concurrency = _OnTransport()
    timeout = _OnTransport()
    max_retries = _OnTransport()
    backoff_base = _OnTransport()
    backoff_max = _OnTransport()
    extra_body = _OnTransport()

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
        self._transport = TeacherTransport(
            base_url,
            model,
            api_key,
            max_concurrency,
            timeout,
            max_retries,
            api_key_env=api_key_env,
            extra_body=extra_body,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            role=role,
        )
        self._n_honored: bool | None = None  # whether the server returns n choices per request

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
        key = "<set>" if self._transport.has_api_key else None
        return (
            f"TeacherClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key}, "
            f"max_concurrency={self.max_concurrency}, timeout={self.timeout}, max_retries={self.max_retries})"
        )

    # ------------------------------------------------------------ public: batch methods

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
        params = self._transport.params(max_tokens, temperature, top_p, extra_body, reasoning)
        _check_int("n", n, 1)
        return self._transport.submit(self._sample(messages, n, params, errors))

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

    def compress_async(
        self,
        texts: Sequence[str],
        max_tokens: int = COMPRESSION_MAX_TOKENS,
        temperature: float = 1.0,
        top_p: float = 1.0,
        *,
        extra_body: Mapping[str, Any] | None = None,
        on_each: Callable[[int, str | None], None] | None = None,
    ) -> concurrent.futures.Future:
        """:meth:`compress` without blocking: a Future of its result. ``on_each(index, result)``, where given, is
        called with each text's result as soon as it is in, on the client's own thread (an exception it raises is
        logged, and changes nothing of the batch)."""
        texts = _check_list("texts", texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"texts[{i}] must be a string, got {type(text).__name__}")
        params = self._transport.params(max_tokens, temperature, top_p, extra_body)
        return self._transport.submit(self._compress(texts, params, on_each))

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
        params = self._transport.params(max_tokens, temperature, top_p, extra_body)
        return self._transport.submit(self._hint(responses, params))

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

        return self._transport.submit(self._sequence_logprobs(sequences, prompt_lengths, k, read))

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

        return self._transport.submit(self._sequence_logprobs(sequences, prompt_lengths, 1, read))

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
        # reasoning=False: the verdict is the reply's content, which the strict parser reads as it is
        params = self._transport.params(max_tokens, 0.0, 1.0, extra_body, reasoning=False)
        return self._transport.submit(self._judge(prompts, params))

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

    # ------------------------------------------------------------ public: health, stats, lifetime

    def health(self, timeout: float | None = None) -> bool:
        """Whether the endpoint serves chat completions for ``model`` (one 1-token request).

        False, with the reason logged as a warning, for an unreachable server, a wrong
        path, a model the server does not serve, or a non-OpenAI reply. Not retried and
        not counted in :meth:`stats`.
        """
        return self._transport.health(timeout)

    def unhealthy_reason(self, timeout: float | None = None) -> str | None:
        """What :meth:`health` checks, without the warning: why the endpoint does not serve ``model``, or None."""
        return self._transport.unhealthy_reason(timeout)

    def stats(self, reset: bool = False) -> dict[str, float]:
        """Counters since creation (or the last reset), all numeric, for logging.

        ``requests`` started, ``succeeded``, ``failed`` (after all retries), ``retries``,
        ``in_flight``; ``replies`` received and ``top_ups`` (single requests standing in
        for ``n``); ``prompt_tokens``/``completion_tokens`` as the server reports them;
        ``latency_mean_s``/``latency_max_s`` of succeeded requests (retries included);
        ``compressed``/``untagged`` and ``unusable`` (compression replies with nothing
        left after their thinking); ``hinted`` (usable hints); ``judged``/``judged_correct``/``verdict_unparsed``.
        """
        return self._transport.stats(reset)

    def close(self) -> None:
        """Cancel unfinished work, close the HTTP client and stop the event-loop thread.

        Futures still pending are cancelled. A later call starts a fresh loop and client.
        """
        self._transport.close()

    def __enter__(self) -> TeacherClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals: the requests

    async def _chat(
        self, messages: list[dict], n: int, params: dict, failures: list[str]
    ) -> tuple[list[str] | None, bool]:
        """One logical chat request with retries: (reply texts or None, whether the server rejected it as a
        client error). A request that finally fails appends its last error to ``failures``."""

        async def send() -> tuple[list[str], Any]:
            response = await self._transport.client.chat.completions.create(
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

        return await self._transport.with_retries(send, failures)

    async def _sequence_logprobs(
        self, sequences: list[list[int]], prompt_lengths: list[int], top_k: int, read: Callable
    ) -> list:
        """Each sequence's ``prompt_logprobs`` at its completion positions, turned into a result by ``read(positions,
        sequence)``; None for a sequence whose request failed."""
        failures: list[str] = []

        async def one(sequence: list[int], prompt_length: int):
            async def send():
                response = await self._transport.client.completions.create(
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

            replies, _ = await self._transport.with_retries(send, failures)  # one reply: the sequence's result
            return None if replies is None else replies[0]

        return await self._transport.gather(
            "teacher log-probs", [one(seq, n) for seq, n in zip(sequences, prompt_lengths)], failures
        )

    # ------------------------------------------------------------ internals: the jobs

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
                self._transport.count(top_ups=missing)
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
        return await self._transport.gather(
            "teacher sampling", (one(i, m) for i, m in enumerate(conversations)), failures
        )

    async def _compress(
        self, texts: list[str], params: dict, on_each: Callable[[int, str | None], None] | None = None
    ) -> list[str | None]:
        failures: list[str] = []

        async def compressed(text: str) -> str | None:
            replies, _ = await self._chat([{"role": "user", "content": render_compression(text)}], 1, params, failures)
            if replies is None:
                return None
            summary, tagged = extract_summary(replies[0])
            if summary is None:
                self._transport.count(unusable=1)
                return None
            self._transport.count(compressed=1, untagged=0 if tagged else 1)
            return summary

        async def one(index: int, text: str) -> str | None:
            result = await compressed(text)
            if on_each is not None:
                try:
                    on_each(index, result)
                except Exception:  # noqa: BLE001 - what waits on one compression must not fail the batch
                    logger.exception("compression %d: the callback on its result failed", index)
            return result

        return await self._transport.gather("compression", (one(i, t) for i, t in enumerate(texts)), failures)

    async def _hint(self, responses: list[str], params: dict) -> list[str | None]:
        failures: list[str] = []

        async def one(response: str) -> str | None:
            replies, _ = await self._chat([{"role": "user", "content": render_hint(response)}], 1, params, failures)
            if replies is None:
                return None
            hint = strip_thinking(replies[0]).strip()
            self._transport.count(hinted=int(bool(hint)), unusable=int(not hint))
            return hint or None

        return await self._transport.gather("hint generation", (one(r) for r in responses), failures)

    async def _judge(self, prompts: list[str], params: dict) -> list[bool | None]:
        failures: list[str] = []

        async def one(prompt: str) -> bool | None:
            replies, _ = await self._chat([{"role": "user", "content": prompt}], 1, params, failures)
            if replies is None:
                return None  # no verdict (counted as a failed request)
            verdict = parse_verdict(replies[0])
            self._transport.count(judged=1, judged_correct=int(verdict is True), verdict_unparsed=int(verdict is None))
            return verdict is True

        return await self._transport.gather("judging", (one(p) for p in prompts), failures)
