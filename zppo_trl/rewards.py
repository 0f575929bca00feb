"""The binary reward: mathruler's boxed-answer grader with a time guard, and TRL reward functions.

The paper's reward (appendix "The binary reward"): mathruler's ``extract_boxed_content``
takes the last ``\\boxed{...}`` span, ``grade_answer`` compares it with the gold answer;
if that fails, degree and percent signs are stripped from both sides and it is graded
once more. No span scores 0.

The verdict is mathruler's own: its string normalisation and comparison run unchanged.
Only the step that evaluates expressions is guarded. mathruler ends in
``sympy.parse_expr``, which evaluates Python and can run for ever on an answer such as
``9**9**9**9``, so grading never runs in the caller's process: a small pool of worker
processes (one per core, at most :data:`DEFAULT_WORKERS`) grades, each answer under a hard
deadline; a worker that overruns is killed and replaced and that answer scores 0. Inside
the workers a screen sits in front of the sympy step alone: an expression that is too long
or has Python syntax no answer needs (``__``, quotes, ``;``, ``import`` ...) is never
evaluated, and that comparison counts as unequal. Results are cached per (answer, gold)
pair, since the answers of one rollout group repeat.

This module is pure apart from its worker processes: no TRL, no trainer.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)

__all__ = [
    "GuardedGrader",
    "boxed_accuracy_reward",
    "boxed_spans",
    "completion_text",
    "default_grader",
    "extract_boxed",
    "grade",
    "grade_batch",
    "judged_accuracy_reward",
    "strip_degree_percent",
]

DEFAULT_WORKERS = 2
DEFAULT_TIMEOUT = 3.0  # seconds per distinct answer; legitimate answers take milliseconds
# The screen in front of sympy: longer expressions, and Python syntax that no math answer
# needs, are never evaluated (mathruler's own string comparison still runs on them).
MAX_SYMPY_CHARS = 1000
_UNSAFE_EXPRESSION = re.compile(r"__|[\"'`;@\x00]|\b(?:lambda|import|exec|eval|open|getattr|globals|locals)\b")
_BOX_OPEN = "\\boxed{"
_BRACE = re.compile(r"[{}]")


# ---------------------------------------------------------------- extraction


def extract_boxed(text: str | None) -> str | None:
    """mathruler's ``extract_boxed_content``: the content of the LAST ``\\boxed{``, stripped.

    Returns None where mathruler finds no span: no ``\\boxed{``, or the last one is
    never closed (a truncated rollout; an earlier complete box does not count), and also
    where the last box is empty (mathruler's "" can never match a gold answer). Braces
    are counted as mathruler counts them. Linear in ``len(text)``.
    """
    if not text:
        return None
    start = text.rfind(_BOX_OPEN)
    if start < 0:
        return None
    begin = start + len(_BOX_OPEN)
    close = _closing_brace(text, begin)
    return None if close is None else text[begin:close].strip() or None


def _closing_brace(text: str, begin: int) -> int | None:
    """The index of the ``}`` that closes a brace opened just before ``begin`` (None: never closed), counting
    braces as mathruler counts them."""
    depth = 0
    for brace in _BRACE.finditer(text, begin):
        if brace.group() == "{":
            depth += 1
        elif depth:
            depth -= 1
        else:
            return brace.start()
    return None


def boxed_spans(text: str | None) -> list[tuple[int, int]] | None:
    """Every ``\\boxed{...}`` span of ``text`` as ``(start, end)`` slices, left to right, braces counted as
    :func:`extract_boxed` counts them; a box nested in another is part of the outer span.

    Returns None when a ``\\boxed{`` is never closed (a truncated text: where its content ends is
    unknown), and ``[]`` when there is no box."""
    spans: list[tuple[int, int]] = []
    start = (text or "").find(_BOX_OPEN)
    while start >= 0:
        close = _closing_brace(text, start + len(_BOX_OPEN))
        if close is None:
            return None
        spans.append((start, close + 1))
        start = text.find(_BOX_OPEN, close + 1)
    return spans


_DEGREE_PERCENT = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°|\\%|%")


def strip_degree_percent(answer: str) -> str:
    """``answer`` without degree signs (``^\\circ``, ``^{\\circ}``, ``°``, ``\\degree``) and percent signs."""
    return _DEGREE_PERCENT.sub("", answer).strip()


# ---------------------------------------------------------------- the grading rule (runs in workers)


def _grade_span(span: str, gold: str) -> bool:
    """The paper's rule on an extracted span: mathruler, then the degree/percent retry."""
    from mathruler.grader import grade_answer

    if grade_answer(span, gold):
        return True
    stripped_span, stripped_gold = strip_degree_percent(span), strip_degree_percent(gold)
    if (stripped_span, stripped_gold) == (span, gold) or not stripped_span:
        return False
    return bool(grade_answer(stripped_span, stripped_gold))


def is_safe_to_evaluate(expression: str) -> bool:
    """The screen in front of sympy: short, and free of Python syntax no answer needs."""
    return len(expression) <= MAX_SYMPY_CHARS and not _UNSAFE_EXPRESSION.search(expression)


def _install_sympy_screen() -> list[int]:
    """Put the screen in front of mathruler's sympy step, in this (worker) process only.

    ``grade_answer`` looks ``are_equal_under_sympy`` up in its module at call time, so
    wrapping that one name guards the only step that evaluates an expression while every
    other step of mathruler runs as published. Returns a one-element counter of refusals.
    """
    from mathruler import grader

    evaluate = grader.are_equal_under_sympy
    refused = [0]

    def screened(ground_truth_normalized: str, given_normalized: str) -> bool:
        if not (is_safe_to_evaluate(ground_truth_normalized) and is_safe_to_evaluate(given_normalized)):
            refused[0] += 1
            return False
        return evaluate(ground_truth_normalized, given_normalized)

    grader.are_equal_under_sympy = screened
    return refused


def _worker_main() -> None:  # pragma: no cover - exercised through GuardedGrader
    """Worker loop: one JSON ``[span, gold]`` per stdin line; per line out, the verdict
    (``0``/``1``) and how many sympy comparisons the screen refused for it."""
    try:
        import resource

        limit = 4 << 30  # a runaway sympy expression must not take the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    refused = _install_sympy_screen()  # imports mathruler before announcing readiness

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        before = refused[0]
        try:
            span, gold = json.loads(line)
            ok = _grade_span(span, gold)
        except Exception:  # noqa: BLE001 - any failure of the grader is a wrong answer
            ok = False
        out.write(f"{int(ok)} {refused[0] - before}\n")
        out.flush()


# ---------------------------------------------------------------- the guarded pool


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from zppo_trl.rewards import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.ready = False
        self.task: int | None = None
        self.deadline = time.monotonic() + 120.0  # start-up (imports sympy)
        self.buffer = b""

    def send(self, index: int, span: str, gold: str, timeout: float) -> None:
        self.task = index
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write((json.dumps([span, gold]) + "\n").encode())
        self.proc.stdin.flush()

    def read_lines(self) -> list[str]:
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line.decode() for line in lines]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class GuardedGrader:
    """Grades (response, gold) pairs with mathruler in killable worker processes.

    Args:
        workers: worker processes (default: ``min(2, cores)``).
        timeout: seconds one distinct answer may take before its worker is killed and
            the answer scores 0.
        cache_size: (span, gold) results kept, least recently used evicted.

    ``stats`` counts graded pairs, cache hits, sympy comparisons the screen refused, and
    timeouts. Thread-safe; workers start on first use and stop at exit or :meth:`close`.
    """

    def __init__(self, workers: int | None = None, timeout: float = DEFAULT_TIMEOUT, cache_size: int = 200_000):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.num_workers = workers or max(1, min(DEFAULT_WORKERS, os.cpu_count() or 1))
        self.timeout = timeout
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.stats = {"graded": 0, "cache_hits": 0, "screened": 0, "timeouts": 0, "worker_restarts": 0}
        atexit.register(self.close)

    # -- public

    def grade_batch(self, responses: Sequence[str | None], golds: Sequence[Any]) -> list[bool]:
        """``grade`` for each (response, gold) pair, in order; distinct answers graded in parallel."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        keys: list[tuple[str, str] | None] = []
        for response, gold in zip(responses, golds):
            span = extract_boxed(response) if isinstance(response, str) else None
            keys.append(None if span is None else (span, _gold_text(gold)))
        with self._lock:
            self.stats["graded"] += len(keys)
            todo = {key: None for key in keys if key is not None and key not in self._cache}
            self.stats["cache_hits"] += sum(1 for key in keys if key is not None) - len(todo)
            results = self._grade_distinct(list(todo))
            for key, ok in zip(todo, results):
                self._remember(key, ok)
            out = []
            for key in keys:
                if key is None:
                    out.append(False)
                else:
                    self._cache.move_to_end(key)
                    out.append(self._cache[key])
            return out

    def close(self) -> None:
        """Stop the worker processes (they restart on the next call)."""
        for worker in self._workers:
            worker.kill()
        self._workers = []

    # -- internals

    def _remember(self, key: tuple[str, str], ok: bool) -> None:
        self._cache[key] = ok
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    @staticmethod
    def _known(span: str, gold: str) -> bool | None:
        """The verdict without a worker where mathruler's is certain: identical strings match."""
        return True if span == gold else None

    def _grade_distinct(self, pairs: list[tuple[str, str]]) -> list[bool]:
        results: list[bool | None] = [self._known(span, gold) for span, gold in pairs]
        pending = [i for i, r in enumerate(results) if r is None]
        if not pending:
            return [bool(r) for r in results]
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker())
        queue = list(reversed(pending))
        with selectors.DefaultSelector() as selector:
            for worker in self._workers:
                selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
            while queue or any(w.task is not None for w in self._workers):
                for worker in self._workers:
                    if worker.ready and worker.task is None and queue:
                        index = queue.pop()
                        try:
                            worker.send(index, *pairs[index], self.timeout)
                        except OSError:  # died between tasks: replace it, retry the answer
                            queue.append(index)
                            worker.task = None
                            self._replace(selector, worker)
                # Only busy or starting workers have a live deadline; an idle one's is stale.
                live = [w.deadline for w in self._workers if w.task is not None or not w.ready]
                wait = max(0.0, min(live) - time.monotonic()) if live else 0.0
                for key, _ in selector.select(timeout=min(wait, 1.0)):
                    worker = key.data
                    try:
                        lines = worker.read_lines()
                    except (EOFError, OSError):
                        self._fail(selector, worker, results)
                        continue
                    for line in lines:
                        if line == "ready":
                            worker.ready = True
                        elif worker.task is not None:
                            verdict, refused = line.split()
                            results[worker.task] = verdict == "1"
                            self.stats["screened"] += int(refused)
                            worker.task = None
                now = time.monotonic()
                for worker in list(self._workers):
                    if worker.deadline < now and (worker.task is not None or not worker.ready):
                        if worker.task is not None:
                            self.stats["timeouts"] += 1
                            logger.warning(
                                "grading %r timed out after %.1fs; scored 0", pairs[worker.task][0][:80], self.timeout
                            )
                        self._fail(selector, worker, results)
        return [bool(r) for r in results]

    def _fail(self, selector, worker: _Worker, results: list) -> None:
        """A worker died or overran: its answer scores 0 and a fresh worker takes its place."""
        if worker.task is not None:
            results[worker.task] = False
        elif not worker.ready:
            raise RuntimeError("the grader worker process failed to start (see `python -c 'import mathruler.grader'`)")
        self._replace(selector, worker)

    def _replace(self, selector, worker: _Worker) -> None:
        selector.unregister(worker.proc.stdout)
        worker.kill()
        fresh = _Worker()
        self._workers[self._workers.index(worker)] = fresh
        selector.register(fresh.proc.stdout, selectors.EVENT_READ, fresh)
        self.stats["worker_restarts"] += 1


def _gold_text(gold: Any) -> str:
    if gold is None:
        raise ValueError("gold answer is None; every row needs an answer")
    return str(gold).strip()


_default_grader: GuardedGrader | None = None
_default_lock = threading.Lock()


def default_grader() -> GuardedGrader:
    """The process-wide :class:`GuardedGrader` used by :func:`grade` and the reward functions."""
    global _default_grader
    with _default_lock:
        if _default_grader is None:
            _default_grader = GuardedGrader()
        return _default_grader


def grade(response: str | None, gold: Any) -> bool:
    """Whether ``response``'s last ``\\boxed{}`` answer matches ``gold``.

    mathruler's ``grade_answer`` on the extracted span (:func:`extract_boxed`), then the
    same with degree and percent signs stripped from both sides: mathruler's verdict,
    except that the sympy step never sees an expression the screen refuses and an answer
    that overruns the time guard scores 0. False without a span. Never raises on any
    response string and never takes longer than the grader's timeout.
    """
    return default_grader().grade_batch([response], [gold])[0]


def grade_batch(responses: Sequence[str | None], golds: Sequence[Any]) -> list[bool]:
    """:func:`grade` over pairs, using the shared worker pool and answer cache."""
    return default_grader().grade_batch(responses, golds)


# ---------------------------------------------------------------- TRL reward functions


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a message list (the last message's text)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, Sequence) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], Mapping) else completion[-1]
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(
                part.get("text", "") for part in content if isinstance(part, Mapping) and part.get("type") == "text"
            )
    if completion in (None, []):
        return ""
    raise TypeError(f"cannot read a completion of type {type(completion).__name__}")


def boxed_accuracy_reward(completions: Sequence[Any], answer: Sequence[Any], **kwargs) -> list[float]:
    """TRL reward function: 1.0 where the completion's last ``\\boxed{}`` matches ``answer``, else 0.0.

    Accepts TRL's standard (string) and conversational (message list) completions;
    ``answer`` is the dataset column of gold answers, aligned with ``completions``.
    """
    texts = [completion_text(c) for c in completions]
    return [float(ok) for ok in grade_batch(texts, answer)]


class Judge(Protocol):
    """What :func:`judged_accuracy_reward` needs, e.g. a `zppo_trl.teacher.TeacherClient`."""

    def judge(self, items: Sequence[Mapping[str, Any]]) -> list[bool | None]: ...


def judged_accuracy_reward(
    judge: Judge, question_column: str = "question", options_column: str = "options"
) -> Callable[..., list[float]]:
    """A TRL reward function that routes as the paper does: grader first, judge on zeros.

    The deterministic grader scores every completion; only completions it scores 0 go
    to ``judge.judge`` (items with ``question``, ``response``, ``ground_truth`` and
    ``options`` where the dataset has that column). A verdict the judge could not give (its
    request failed) is None, TRL's "not scored", never a wrong answer: the trainer leaves such a
    rollout's group out of the step (see ``docs/zppo_trainer.md``), and an outage never raises
    here. The question is read from ``question_column``, falling back to the prompt TRL passes.
    The function's ``clients`` names the judge, whose requests and failures the trainer logs
    under ``zppo/judge/``.
    """

    def reward(completions: Sequence[Any], answer: Sequence[Any], **kwargs) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        scores = [float(ok) for ok in grade_batch(texts, answer)]
        retry = [i for i, score in enumerate(scores) if score == 0.0]
        if retry:
            questions = kwargs.get(question_column) or [
                completion_text(p) for p in kwargs.get("prompts", [""] * len(texts))
            ]
            options = kwargs.get(options_column)
            items = [
                {
                    "question": questions[i],
                    "response": texts[i],
                    "ground_truth": str(answer[i]),
                    **({"options": options[i]} if options is not None else {}),
                }
                for i in retry
            ]
            for i, verdict in zip(retry, judge.judge(items)):
                scores[i] = None if verdict is None else 1.0 if verdict else 0.0
        return scores

    reward.__name__ = "judged_accuracy_reward"
    reward.clients = [("judge", judge)]  # the trainer counts its requests and failures (zppo/judge/)
    return reward
