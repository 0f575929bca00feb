"""Running the suite against an OpenAI-compatible endpoint: the options, and generate, score, judge per setting.

One run directory holds one checkpoint's evaluation::

    run.json                 what was asked (model, endpoint, settings, passes, decoding, ...)
    records/<setting>.jsonl  one line per finished generation and per finished judgment, appended
                             as they complete: the run's memory, and why a run resumes
    details/<setting>.parquet  per-sample details (one file per setting, like lighteval's --save-details)
    results.json             per setting: mean over passes, its stderr, n; per family: macro average

This module holds `EvalOptions` and `run_suite` (what ``zppo-eval run`` calls), and the per-item work: build,
generate, score, judge, on `zppo_trl.evaluation.parallel.run_all`'s threads. run.json's resume guard and
the records are `zppo_trl.evaluation.store`'s; the scores, results.json and the details files are
`zppo_trl.evaluation.summaries`'. Their names are re-exported here, where the other modules first found them.

A crashed or interrupted run is resumed by running the same command again: every generation and
judgment already in ``records/`` is reused, only the missing ones are requested. ``run.json``
guards the resume: a different model, decoding or sample budget is refused (a new directory is
the way to change them), so a directory never mixes two configurations.

Scoring follows the paper's appendix (see `zppo_trl.evaluation.scorers`): the deterministic step
first; on ``+Judge`` paths the shared judge only where it scored 0 (extracted snippet when a span
parsed, else the full response); ``benchjudge`` settings by their benchmark's own judge prompt.
An item that cannot be built or scored (unreadable image, missing video, a row without its gold
answer, an OCRBench v2 task type not implemented) is skipped, counted per setting and logged with
its reason; it is never scored as right or wrong. A judge reply that does not parse scores 0 and
is counted (``judge_unparsed``). Requests that fail after the client's retries are not recorded;
the run stops with an error saying how many, and the next run requests them again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..prompts import render_judge
from ..teacher import TeacherClient, parse_verdict
from .audit import audit_keys, audit_prompt, audited
from .data import load_setting
from .judges import request_judge_prompt
from .parallel import run_all
from .prompting import build_requests
from .scorers import score_deterministic
from .store import (
    RUN_FILE,
    EvaluationError,
    RecordStore,
    RunDirectoryMismatch,
    check_resume,
    fingerprint,
    item_key,
    parse_key,
    write_json,
)
from .summaries import (
    RESULTS_FILE,
    family_summary,
    read_results,
    scored_by_pass,
    summarize_setting,
    warn_skips,
    write_details,
    write_results,
)
from .tasks import JUDGE_DECODING, PAPER_DECODING, SUITE, DecodingConfig, TaskSpec

logger = logging.getLogger(__name__)

# The run's API; the names from `store` and `summaries` are re-exported, where the other modules first found them.
__all__ = [
    "RESULTS_FILE",
    "RUN_FILE",
    "SAMPLING_FIELDS",
    "EvalOptions",
    "EvaluationError",
    "RecordStore",
    "RunDirectoryMismatch",
    "ask_judge",
    "family_summary",
    "fingerprint",
    "item_key",
    "judge_score",
    "run_suite",
    "sampling_extra_body",
    "scored_by_pass",
    "summarize_setting",
    "write_json",
]

SAMPLING_FIELDS = ("all", "openai")


@dataclass(frozen=True)
class EvalOptions:
    """What a run asks for besides the endpoints.

    Attributes:
        passes: evaluation passes per setting, averaged (paper: 5 for a frozen checkpoint).
        decoding: the student's sampling (default: the paper's evaluation configuration).
        max_samples: rows per setting (DynaMath: seeds); None for the full set.
        seed: seeds the option shuffles (GPQA-D) per pass.
        max_frames: frames sampled per video (`zppo_trl.evaluation.media.video_frames`).
        concurrency: items in flight; each worker sends its item's student request, then (where
            needed) its judge request, so the two endpoints share this bound.
        sources: setting name -> a local dataset directory or Hub id (default: the spec's Hub id).
        video_dir, subtitle_dir: setting name -> where its video files / subtitles are.
        sampling_fields: ``"all"`` sends every field of `decoding` (vLLM reads them all);
            ``"openai"`` only OpenAI's own (temperature, top-p, presence penalty), for servers that
            reject the others (``transformers serve`` answers 422): not the paper's decoding.
        condition: text before the closer of every question (``"<correct>"`` for a Correction-SFT
            checkpoint, the tag it trained under); None for the paper's shared prompt.
        condition_source: where ``condition`` came from, in words (``zppo-eval run`` resolves it from
            ``--condition`` or the checkpoint's record: `zppo_trl.evaluation.condition`); run.json keeps it.
        audit_rule: per Exact + Judge and Rule + Judge setting, how many items the deterministic step
            scored 1 the shared judge re-checks (`zppo_trl.evaluation.audit`); 0: none. Needs a judge.
    """

    passes: int = PAPER_DECODING.passes
    decoding: DecodingConfig = PAPER_DECODING
    max_samples: int | None = None
    seed: int = 0
    max_frames: int = 32
    concurrency: int = 32
    sources: Mapping[str, str] = field(default_factory=dict)
    video_dir: Mapping[str, str] = field(default_factory=dict)
    subtitle_dir: Mapping[str, str] = field(default_factory=dict)
    sampling_fields: str = "all"
    condition: str | None = None
    condition_source: str | None = None
    audit_rule: int = 0

    def __post_init__(self) -> None:
        if self.sampling_fields not in SAMPLING_FIELDS:
            raise ValueError(f"sampling_fields must be one of {SAMPLING_FIELDS}, got {self.sampling_fields!r}")
        if self.passes < 1:
            raise ValueError(f"passes must be at least 1, got {self.passes}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {self.max_samples}")
        if self.audit_rule < 0:
            raise ValueError(f"audit_rule must be at least 0, got {self.audit_rule}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if not self.decoding.max_new_tokens:
            raise ValueError("decoding.max_new_tokens must be set (the paper: 12,288)")


def sampling_extra_body(decoding: DecodingConfig, fields: str = "all") -> dict[str, Any]:
    """The decoding's per-request fields beyond temperature and top-p, as request-body JSON.

    ``fields="all"``: the presence penalty, and what vLLM reads beyond OpenAI's parameters: top-k,
    min-p and the repetition penalty. ``fields="openai"``: the presence penalty alone. Fields the
    decoding leaves None are not sent. The pixel bounds are not per request: vLLM refuses
    per-request ``mm_processor_kwargs`` unless started with ``--trust-request-mm-kwargs``, so they
    belong on the server (``vllm serve --mm-processor-kwargs``, see docs/evaluation.md).
    """
    names = (
        ("presence_penalty",) if fields == "openai" else ("top_k", "min_p", "presence_penalty", "repetition_penalty")
    )
    return {name: getattr(decoding, name) for name in names if getattr(decoding, name) is not None}


# ------------------------------------------------------------------ scoring one item


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as text for the details file: image parts shown as ``<image>``."""
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = "".join(part.get("text", "") if part.get("type") == "text" else "<image>" for part in content or [])
        lines.append(f"[{message.get('role')}] {text}")
    return "\n".join(lines)


def _judge_prompt(spec: TaskSpec, request: Any, response: str, verdict: Any) -> str | None:
    """The judge prompt this item needs, or None where the deterministic verdict stands."""
    if spec.scoring == "benchjudge":
        return request_judge_prompt(spec, request, response)
    if verdict is None or not verdict.consult_judge:
        return None
    return render_judge(request.question, verdict.judge_input, verdict.gold, request.options)


def _scored_fields(spec: TaskSpec, row: Mapping[str, Any], verdict: Any) -> dict[str, Any]:
    """What the harness's own scoring records for an item: the deterministic verdict, where the
    path has one, and what the benchmark's official aggregation reads (facets, answered)."""
    fields: dict[str, Any] = {
        "facets": {name: row.get(name) for name in spec.facets},
        "answered": None if spec.answered is None or verdict is None else bool(spec.answered(verdict.extracted, row)),
    }
    if verdict is not None:
        fields.update(extracted=verdict.extracted, gold=verdict.gold, det_score=verdict.score, rule=verdict.rule,
                      group=verdict.group, score=verdict.score)  # fmt: skip
    return fields


def ask_judge(judge: TeacherClient, prompt: str) -> tuple[str | None, str]:
    """(reply, "") from `judge` at the paper's judge decoding, or (None, why) where it refused or failed.

    A why starting ``"rejected: "`` is a prompt the endpoint refused as a client error (retrying cannot help).
    """
    errors: list = []
    (replies,) = judge.sample(
        [prompt], n=1, max_tokens=JUDGE_DECODING.max_new_tokens, temperature=JUDGE_DECODING.temperature,
        top_p=JUDGE_DECODING.top_p, errors=errors, reasoning=False,  # the verdict is the reply's content
    )  # fmt: skip
    return (replies[0], "") if replies else (None, errors[0] or "no reply")


def judge_score(spec: TaskSpec, row: Mapping[str, Any], reply: str) -> tuple[float, bool]:
    """(score, parsed) of a judge reply, by the setting's parser (strict: unparsed scores 0)."""
    if spec.scoring == "benchjudge":
        result = spec.bench_judge.parse(row, reply)
        return float(result.score), bool(result.parsed)
    verdict = parse_verdict(reply)
    return (1.0 if verdict is True else 0.0), verdict is not None


# ------------------------------------------------------------------ one setting


@dataclass
class _Counters:
    failed_generations: int = 0
    failed_judgments: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


class _SettingRun:
    """One setting's generations and judgments, resumable from its `RecordStore`.

    One worker per item in flight (``concurrency`` of them): it builds the item's prompt, checks
    that the item can be scored (before paying for a generation), generates what is not recorded,
    scores, and asks the judge where the path says so.
    """

    def __init__(self, spec: TaskSpec, rows: list[dict], store: RecordStore, student: TeacherClient,
                 judge: TeacherClient | None, options: EvalOptions):  # fmt: skip
        self.spec, self.rows, self.store = spec, rows, store
        self.student, self.judge, self.options = student, judge, options
        self.counters = _Counters()
        self.abort = threading.Event()
        self._extra_body = sampling_extra_body(options.decoding, options.sampling_fields)

    def run(self) -> None:
        units = [(p, row) for p in range(self.options.passes) for row in self.rows]
        bar = tqdm(total=len(units), desc=f"{self.spec.name:>9}", unit="q", dynamic_ncols=True, leave=True)
        try:
            run_all(
                lambda unit: self._unit(*unit),
                units,
                concurrency=self.options.concurrency,
                abort=self.abort,
                progress=bar,
            )
        finally:
            bar.close()
        failed = self.counters.failed_generations + self.counters.failed_judgments
        if failed:
            raise EvaluationError(
                f"{self.spec.name}: {self.counters.failed_generations} generation(s) and "
                f"{self.counters.failed_judgments} judgment(s) failed after retries (is the endpoint up?); "
                f"finished items are saved in {self.store.path}; run the same command again to resume"
            )

    def _skip(self, key: str, reason: str, row: Mapping[str, Any]) -> None:
        group = None if self.spec.group_field is None else row.get(self.spec.group_field)
        self.store.add({"kind": "skip", "key": key, "reason": reason, "group": None if group is None else str(group)})

    def _unit(self, pass_index: int, row: dict) -> None:
        """Every question of one row in one pass: build, generate, score, judge (what is missing)."""
        if self.abort.is_set():
            return
        try:
            requests = build_requests(
                self.spec,
                row,
                pass_index=pass_index,
                seed=self.options.seed,
                max_frames=self.options.max_frames,
                condition=self.options.condition,
            )
        except (ValueError, OSError) as err:  # MediaError is a ValueError: unreadable image, missing video
            for part in self.spec.parts:  # one skip per question the row carries, so counts are in items
                self._skip(item_key(pass_index, row["_id"], part), f"prompt: {err}", row)
            return
        for request in requests:
            if self.abort.is_set():
                return
            key = item_key(pass_index, row["_id"], request.part)
            unscorable = self._unscorable(request)
            if unscorable:
                self._skip(key, f"score: {unscorable}", row)
                continue
            self._item(key, request, pass_index, row["_id"])

    def _unscorable(self, request: Any) -> str | None:
        """Why this item cannot be scored (an OCR task type not built, a row missing a field), else None."""
        try:
            if self.spec.scoring == "benchjudge":
                _judge_prompt(self.spec, request, "", None)
            else:
                score_deterministic(self.spec, "", request.row)
        except (NotImplementedError, ValueError) as err:
            return str(err)
        return None

    def _generate(self, request: Any) -> tuple[str | None, str | None]:
        """(response, None), or (None, why) where the endpoint refused the request or failed."""
        errors: list = []
        decoding = self.options.decoding
        (replies,) = self.student.sample(
            [request.messages], n=1, max_tokens=decoding.max_new_tokens, temperature=decoding.temperature,
            top_p=decoding.top_p, extra_body=self._extra_body, errors=errors,
        )  # fmt: skip
        return (replies[0], None) if replies else (None, errors[0] or "no reply")

    def _item(self, key: str, request: Any, pass_index: int, row_id: str) -> None:
        prompt = _prompt_text(request.messages)
        generation = self.store.generations.get(key)
        if generation is None or generation["prompt"] != prompt:  # a changed prompt is a new item
            response, error = self._generate(request)
            if response is None:
                if error.startswith(
                    "rejected: "
                ):  # a request the server refuses (too long, bad image): retrying cannot help
                    self._skip(key, f"endpoint {error}", request.row)
                else:
                    self._failed("failed_generations")
                return
            generation = {"kind": "generation", "key": key, "pass": pass_index, "row_id": row_id, "part": request.part,
                          "prompt": prompt, "response": response}  # fmt: skip
            self.store.add(generation)
        self._score(key, request, generation["response"])

    def _score(self, key: str, request: Any, response: str) -> None:
        """The deterministic verdict, then the judge where the path asks for it; one judgment record."""
        spec = self.spec
        verdict = None if spec.scoring == "benchjudge" else score_deterministic(spec, response, request.row)
        prompt = _judge_prompt(spec, request, response, verdict) if self.judge is not None else None
        digest = fingerprint(response, prompt, self.judge.model if prompt is not None else None)
        scored = _scored_fields(spec, request.row, verdict)
        done = self.store.judgments.get(key)
        if done is not None and done.get("digest") == digest:
            # The same response and judge prompt: the judge's verdict stands, but what the scorer
            # itself decides is taken afresh, so a resumed run picks up a fixed rule or metric.
            refreshed = {**done, **scored}
            if prompt is not None:
                refreshed["score"] = done["score"]
            if refreshed != done:
                self.store.add(refreshed)
            return
        judgment = {"kind": "judgment", "key": key, "digest": digest, "judge_prompt": prompt, "judge_reply": None,
                    "judge_score": None, "judge_parsed": None, "group": None, **scored}  # fmt: skip
        if prompt is not None:
            reply, error = self._ask_judge(prompt)
            if reply is None:
                if error.startswith("rejected: "):
                    self._skip(key, f"judge endpoint {error}", request.row)
                else:
                    self._failed("failed_judgments")
                return
            score, parsed = judge_score(spec, request.row, reply)
            # The shared judge runs only where the deterministic step gave 0, so its verdict is the score.
            judgment.update(judge_reply=reply, judge_score=score, judge_parsed=parsed, score=score)
        self.store.add(judgment)

    def _ask_judge(self, prompt: str) -> tuple[str | None, str]:
        return ask_judge(self.judge, prompt)

    # -------------------------------------------------------------- the rule audit

    def audit(self, n: int) -> None:
        """Ask the judge about `n` rule-positive items (`zppo_trl.evaluation.audit`); records kind ``audit``."""
        rows = {row["_id"]: row for row in self.rows}
        todo = []
        for key in audit_keys(self.store.judgments, n, self.options.seed, self.store.skips):
            pass_index, row_id, part = parse_key(key)
            if row_id not in rows or key not in self.store.generations:
                continue
            requests = build_requests(
                self.spec, rows[row_id], pass_index=pass_index, seed=self.options.seed,
                max_frames=self.options.max_frames, condition=self.options.condition,
            )  # fmt: skip
            request = next(request for request in requests if (request.part or "") == part)
            prompt = audit_prompt(request, self.store.judgments[key], self.store.generations[key]["response"])
            digest = fingerprint(prompt, self.judge.model)
            if self.store.audits.get(key, {}).get("digest") != digest:
                todo.append((key, request, prompt, digest))
        bar = tqdm(total=len(todo), desc=f"{self.spec.name:>9} audit", unit="q", dynamic_ncols=True)
        try:
            run_all(
                lambda item: self._audit_item(*item), todo, concurrency=self.options.concurrency, abort=self.abort,
                progress=bar,
            )  # fmt: skip
        finally:
            bar.close()
        if self.counters.failed_judgments:
            raise EvaluationError(
                f"{self.spec.name}: {self.counters.failed_judgments} audit judgment(s) failed after retries "
                f"(is the judge up?); run the same command again to finish the audit"
            )

    def _audit_item(self, key: str, request: Any, prompt: str, digest: str) -> None:
        reply, error = self._ask_judge(prompt)
        if reply is None:
            if not error.startswith("rejected: "):  # a refused prompt is left unaudited, as the judge would skip it
                self.counters.add("failed_judgments")
            return
        score, parsed = judge_score(self.spec, request.row, reply)
        self.store.add({"kind": "audit", "key": key, "digest": digest, "judge_prompt": prompt, "judge_reply": reply,
                        "judge_score": score, "judge_parsed": parsed})  # fmt: skip

    def _failed(self, counter: str) -> None:
        self.counters.add(counter)
        # A dead endpoint fails every request after its retries: stop early rather than wait them all out.
        if self.counters.failed_generations + self.counters.failed_judgments >= max(8, self.options.concurrency):
            self.abort.set()


# ------------------------------------------------------------------ the run


def _check_packages(names: Sequence[str]) -> None:
    """Refuse, before any request, settings whose optional packages are missing, naming the extra."""
    missing = {}
    for name in names:
        spec = SUITE[name]
        absent = list(spec.missing_packages()) if spec.missing_packages is not None else []
        if spec.family == "video" and importlib.util.find_spec("av") is None:  # PyAV decodes the videos
            absent.append("av")
        if absent:
            missing[name] = absent
    if missing:
        listed = "; ".join(f"{name} needs {', '.join(modules)}" for name, modules in missing.items())
        raise ValueError(f"missing optional packages: {listed}. Install them with: pip install 'zppo-trl[eval]'")


def run_suite(
    settings: Iterable[str],
    student: TeacherClient,
    judge: TeacherClient | None,
    run_dir: str | Path,
    options: EvalOptions = EvalOptions(),
    *,
    run_name: str | None = None,
) -> dict:
    """Evaluate `student` on `settings` into `run_dir` (resuming what is there); returns results.json's dict.

    A None `judge` scores the deterministic step alone and skips the BenchJudge settings (not the
    paper's numbers; results.json says ``"judged": false``).
    Raises `EvaluationError` where the endpoint is unreachable or requests failed after retries
    (finished items stay recorded), ValueError for bad settings or data.
    """
    names = list(settings)
    unknown = [name for name in names if name not in SUITE]
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; see zppo_trl.evaluation.tasks.SUITE")
    _check_packages(names)
    if options.audit_rule and judge is None:
        raise ValueError("the rule audit (audit_rule / --audit-rule) asks the shared judge: give a judge endpoint")
    run_dir = Path(run_dir)
    manifest = {
        "run_name": run_name or run_dir.name,
        "model": student.model,
        "base_url": student.base_url,
        "judge_model": judge.model if judge else None,
        "judge_base_url": judge.base_url if judge else None,
        "passes": options.passes,
        "decoding": dataclasses.asdict(options.decoding),
        "sampling_fields": options.sampling_fields,
        "max_samples": options.max_samples,
        "seed": options.seed,
        "max_frames": options.max_frames,
        "condition": options.condition,
        "condition_source": options.condition_source,
        "settings": names,
        "sources": {name: options.sources.get(name) or SUITE[name].dataset for name in names},
    }
    check_resume(run_dir, manifest)
    if options.sampling_fields != "all":
        logger.warning("sending only OpenAI's sampling fields: top-k, min-p and the repetition penalty are the "
                       "server's defaults, so this is not the paper's decoding")  # fmt: skip
    if not student.health(timeout=30):
        raise EvaluationError(
            f"the student endpoint {student.base_url} (model {student.model!r}) does not answer; see the warning above"
        )
    if judge is not None and not judge.health(timeout=30):
        raise EvaluationError(
            f"the judge endpoint {judge.base_url} (model {judge.model!r}) does not answer; see the warning above"
        )
    (run_dir / "records").mkdir(parents=True, exist_ok=True)
    (run_dir / "details").mkdir(exist_ok=True)
    write_json(run_dir / RUN_FILE, manifest)

    previous = read_results(run_dir)
    results_settings: dict[str, Any] = dict(previous.get("settings", {}))
    for name in names:
        spec = SUITE[name]
        if spec.scoring == "benchjudge" and judge is None:
            logger.warning("%s: skipped, its BenchJudge scoring needs a judge endpoint", name)
            continue
        rows = load_setting(
            spec, options.sources.get(name), max_samples=options.max_samples,
            video_dir=options.video_dir.get(name), subtitle_dir=options.subtitle_dir.get(name),
        )  # fmt: skip
        if not rows:
            raise ValueError(
                f"{name}: no rows to evaluate in {options.sources.get(name) or spec.dataset} (after its row filter)"
            )
        store = RecordStore(run_dir / "records" / f"{name}.jsonl")
        setting_run = _SettingRun(spec, rows, store, student, judge, options)
        setting_run.run()
        if options.audit_rule and audited(spec):
            setting_run.audit(options.audit_rule)
        entry, details = summarize_setting(spec, store, options.passes, complete_rows=options.max_samples is None)
        warn_skips(name, store)
        write_details(run_dir / "details" / f"{name}.parquet", details)
        results_settings[name] = entry
        write_results(run_dir, manifest, results_settings, judge is not None)
    return write_results(run_dir, manifest, results_settings, judge is not None)
