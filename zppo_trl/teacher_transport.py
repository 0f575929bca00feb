"""The teacher client's transport: one OpenAI-compatible endpoint, its event loop, retries and counters.

:class:`TeacherTransport` is what :class:`zppo_trl.teacher.TeacherClient` holds to reach its server. It runs
``openai.AsyncOpenAI`` on a private event-loop thread (started on first use, and again after a fork) and
gives each request a place under a concurrency semaphore, a per-attempt timeout, and retries with
exponential backoff and jitter (at least a server's ``Retry-After``). It counts what happened for
:meth:`TeacherTransport.stats`, probes the endpoint's health, and closes cleanly. It knows nothing of what the
requests ask: their shape and their replies' reading are the client's (``teacher.py``, ``teacher_messages.py``).
The argument checks every method of the client shares (``_check_int`` ...) live here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import openai

# The client's logger name: users and tests filter the teacher's warnings by it, wherever the code now lives.
logger = logging.getLogger("zppo_trl.teacher")

__all__ = ["TeacherTransport"]

# 4xx statuses worth another attempt; every 5xx is retried too.
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


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


# ---------------------------------------------------------------- the transport


class TeacherTransport:
    """One OpenAI-compatible endpoint as :class:`zppo_trl.teacher.TeacherClient` reaches it.

    Takes the client's connection arguments (``base_url`` ... ``role``, checked here, with the client's
    error messages) and keeps them as attributes the client exposes. Requests run on a private event-loop
    thread (:meth:`submit`); :meth:`with_retries` sends one logical request under the concurrency limit and
    timeout with retries and backoff, and counts it; :meth:`stats`, :meth:`health` and :meth:`close` are the
    client's own.
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
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._stats = self._zero_stats()

    @property
    def has_api_key(self) -> bool:
        """Whether a key is sent (the key itself is never shown)."""
        return bool(self._api_key)

    @property
    def client(self) -> openai.AsyncOpenAI | None:
        """The ``openai.AsyncOpenAI`` client, for requests running on the loop; None before the first
        :meth:`submit` and after :meth:`close` (a request sent then fails its attempt)."""
        return self._client

    # ------------------------------------------------------------ requests

    def params(
        self, max_tokens: int, temperature: float, top_p: float, extra_body: Mapping | None, reasoning: bool = True
    ) -> dict:
        """A request's decoding parameters, checked, with ``extra_body`` merged over the endpoint's own."""
        return dict(
            max_tokens=_check_int("max_tokens", max_tokens, 1),
            temperature=_check_float("temperature", temperature, 0.0),
            top_p=_check_float("top_p", top_p, 0.0, 1.0, low_open=True),
            extra_body={**self.extra_body, **_check_extra_body(extra_body)},
            reasoning=bool(reasoning),
        )

    def submit(self, coroutine) -> concurrent.futures.Future:
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

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry ``attempt`` (1 for the first): exponential, jittered, capped, and at
        least the server's ``Retry-After`` (itself capped at ``backoff_max``)."""
        delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)) * self._rng.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max))
        return delay

    async def with_retries(
        self, send: Callable[[], Awaitable[tuple[Any, Any]]], failures: list[str]
    ) -> tuple[Any, bool]:
        """Await ``send()`` (returning ``(replies, response)``) under the concurrency limit and timeout, with
        retries and backoff: ``(replies or None, whether the server rejected it as a client error)``; the
        counters are updated and a final failure appends its last error to ``failures``."""
        self.count(requests=1, in_flight=1)
        start = time.monotonic()
        retry_after: float | None = None
        error = "no attempt"
        try:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    self.count(retries=1)
                    await asyncio.sleep(self.backoff(attempt, retry_after))
                retry_after = None
                try:
                    async with self._semaphore:
                        async with asyncio.timeout(self.timeout):
                            replies, response = await send()
                except openai.APIStatusError as err:
                    error = f"HTTP {err.status_code}: {str(err.message)[:200]}"
                    if err.status_code < 500 and err.status_code not in _RETRYABLE_STATUS:
                        self.count(failed=1)
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
            self.count(failed=1)
            failures.append(error)
            return None, False
        finally:
            self.count(in_flight=-1)

    async def gather(self, what: str, coroutines: Iterable[Awaitable], failures: list[str]) -> list:
        """Run a batch; one warning with the last error when some of its requests failed."""
        results = await asyncio.gather(*coroutines)
        if failures:
            logger.warning(
                "%s: %d request(s) to %s failed (last error: %s)", what, len(failures), self.base_url, failures[-1]
            )
        return list(results)

    # ------------------------------------------------------------ counters

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        # The request counters are this module's; the rest are the client's jobs', counted through count().
        names = (
            "requests succeeded failed retries in_flight replies top_ups prompt_tokens completion_tokens "
            "latency_total_s latency_max_s compressed untagged unusable hinted judged judged_correct verdict_unparsed"
        )
        return dict.fromkeys(names.split(), 0)

    def count(self, **deltas: float) -> None:
        """Add ``deltas`` to the named counters (thread-safe)."""
        with self._lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    def stats(self, reset: bool = False) -> dict[str, float]:
        """The counters (:meth:`zppo_trl.teacher.TeacherClient.stats` documents them); ``reset`` zeroes all
        but ``in_flight``."""
        with self._lock:
            stats = dict(self._stats)
            if reset:
                in_flight = self._stats["in_flight"]
                self._stats = self._zero_stats()
                self._stats["in_flight"] = in_flight
        total = stats.pop("latency_total_s")
        stats["latency_mean_s"] = total / stats["succeeded"] if stats["succeeded"] else 0.0
        return stats

    # ------------------------------------------------------------ health and lifetime

    def health(self, timeout: float | None = None) -> bool:
        """Whether the endpoint serves chat completions for ``model``; the reason logged as a warning where not."""
        reason = self.unhealthy_reason(timeout)
        if reason is not None:
            logger.warning("%s endpoint %s (model %s) is not healthy: %s", self.role, self.base_url, self.model,
                           reason)  # fmt: skip
        return reason is None

    def unhealthy_reason(self, timeout: float | None = None) -> str | None:
        """Why the endpoint does not serve ``model`` (one 1-token chat completion, not retried, not counted), or
        None."""
        limit = min(self.timeout, 60.0) if timeout is None else _check_float("timeout", timeout, 0.0, low_open=True)
        return self.submit(self._probe(limit)).result()

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


async def _shutdown(client: openai.AsyncOpenAI) -> None:
    """Cancel every other task on this loop, then close ``client``."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()


def _retry_after(err: openai.APIStatusError) -> float | None:
    """A server's ``Retry-After`` in seconds, where it sent one as a number."""
    try:
        return max(0.0, float(err.response.headers.get("retry-after")))
    except (TypeError, ValueError, AttributeError):
        return None
