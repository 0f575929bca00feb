"""``zppo-eval``: run the suite against a served checkpoint, and compare runs.

    zppo-eval run --base-url http://127.0.0.1:8000/v1 --model ckpt --judge-base-url http://127.0.0.1:8001/v1 \\
        --judge-model judge --tasks vlm,llm,video --output-dir evals/zppo-0.8b
    zppo-eval compare evals/grpo-0.8b evals/zppo-0.8b --bootstrap --plot families.png
    zppo-eval rejudge evals/grpo-0.8b evals/zppo-0.8b --judge-base-url https://api.example.com/v1 \\
        --judge-model other-judge --output-dir evals/judge-sweep
    zppo-eval audit-traces outputs/zppo-2b --judge-base-url URL1 --judge-model judge-a \
        --judge-base-url URL2 --judge-model judge-b --judge-base-url URL3 --judge-model judge-c
    zppo-eval teacher-capability outputs/zppo-0.8b outputs/zppo-2b

``run`` is resumable: the same command on the same ``--output-dir`` continues an interrupted run.
Errors in the arguments or the data print one ``error: ...`` line and exit 2; an endpoint that
fails exits 1 with what was saved and how to resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from ..teacher import TeacherClient
from .arguments import json_object, positive_int
from .condition import resolve_condition
from .runner import EvalOptions, EvaluationError, run_suite
from .tasks import PAPER_DECODING, select

__all__ = ["data_locations", "main", "run_main"]

logger = logging.getLogger(__name__)


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zppo-eval run",
        description="Evaluate a served checkpoint on the paper's suite (resumable; see docs/evaluation.md).",
    )
    endpoint = parser.add_argument_group("endpoints (OpenAI-compatible, e.g. vllm serve)")
    endpoint.add_argument("--base-url", required=True, help="the student's endpoint, e.g. http://127.0.0.1:8000/v1")
    endpoint.add_argument("--model", required=True, help="the served model name of the student")
    endpoint.add_argument("--judge-base-url", help="the shared judge's endpoint (paper: Qwen3.5-27B-FP8)")
    endpoint.add_argument("--judge-model", help="the served model name of the judge")
    endpoint.add_argument(
        "--no-judge",
        action="store_true",
        help="deterministic scoring only; BenchJudge settings are skipped (not the paper's numbers)",
    )
    endpoint.add_argument("--sampling-fields", choices=("all", "openai"), default="all",
                          help="all: every paper decoding field (vLLM); openai: only OpenAI's, for servers that "
                               "reject the rest (transformers serve); not the paper's decoding")  # fmt: skip
    endpoint.add_argument("--extra-body", type=json_object, help="JSON merged into every student request")
    endpoint.add_argument(
        "--judge-extra-body",
        type=json_object,
        help="JSON merged into every judge request; a Qwen3.5 judge on vLLM: "
        '\'{"chat_template_kwargs": {"enable_thinking": false}}\' so its 512 tokens are the verdict',
    )
    endpoint.add_argument("--api-key-env", help="environment variable holding the endpoints' API key")
    endpoint.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take (default 3600)")
    endpoint.add_argument("--max-retries", type=int, default=3, help="retries of a failed request (default 3)")
    run = parser.add_argument_group("what to run")
    run.add_argument(
        "--tasks", default="all", help="families (vlm, llm, video), setting names or all, comma-separated"
    )
    run.add_argument(
        "--output-dir", required=True, type=Path, help="the run directory (created; resumed when it exists)"
    )
    run.add_argument("--run-name", help="the run's row label in comparisons (default: the directory's name)")
    run.add_argument("--data-dir", type=Path,
                     help="local copies: <data-dir>/<setting>/ in the Hub layout (videos/ and subtitles/ beside); "
                          "settings without one load from the Hub")  # fmt: skip
    run.add_argument("--max-samples", type=positive_int, help="rows per setting (DynaMath: seeds); default all")
    run.add_argument(
        "--passes",
        type=positive_int,
        default=PAPER_DECODING.passes,
        help=f"passes averaged (paper: {PAPER_DECODING.passes})",
    )
    run.add_argument(
        "--concurrency",
        type=positive_int,
        default=32,
        help="items in flight (default 32); each sends its student request, then its judge request",
    )
    run.add_argument("--seed", type=int, default=0, help="seeds the per-pass option shuffles (GPQA-D)")
    run.add_argument("--max-frames", type=positive_int, default=32, help="frames sampled per video (default 32)")
    run.add_argument(
        "--condition",
        default=None,
        help="text before the closer of every question, over what the checkpoint records ('none': the paper's "
        "shared prompt); default: the condition the checkpoint's config.json records (a Correction-SFT "
        "checkpoint: '<correct>', the tag it trained under, as the paper evaluates that row), else none",
    )
    run.add_argument(
        "--checkpoint",
        type=Path,
        help="the served checkpoint's directory, read for its recorded condition; default: the directory the "
        "endpoint's /v1/models reports (vLLM's root) or the served model name, where either is local",
    )
    run.add_argument(
        "--audit-rule",
        type=int,
        default=0,
        metavar="N",
        help="per Exact/Rule + Judge setting, ask the judge about N items the deterministic step scored 1 and "
        "count those it scores 0 (the rule's false positives; scores are unchanged); default 0",
    )
    run.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=PAPER_DECODING.max_new_tokens,
        help=f"the student's token budget (paper: {PAPER_DECODING.max_new_tokens}; lower only for smoke tests)",
    )
    return parser


def data_locations(data_dir: Path | None, names: list[str]) -> tuple[dict, dict, dict]:
    """(sources, video dirs, subtitle dirs) for the settings that have a local copy under `data_dir`."""
    sources, videos, subtitles = {}, {}, {}
    if data_dir is None:
        return sources, videos, subtitles
    if not data_dir.is_dir():
        raise ValueError(f"--data-dir {data_dir} is not a directory")
    for name in names:
        root = data_dir / name
        if root.is_dir():
            sources[name] = str(root)
            if (root / "videos").is_dir():
                videos[name] = str(root / "videos")
            if (root / "subtitles").is_dir():
                subtitles[name] = str(root / "subtitles")
    return sources, videos, subtitles


def run_main(argv: list[str] | None = None) -> int:
    """``zppo-eval run``; returns the exit code."""
    args = _run_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        names = select(args.tasks)
        if args.no_judge == bool(args.judge_base_url):
            raise ValueError("give --judge-base-url and --judge-model (the paper's scoring), or --no-judge")
        if args.judge_base_url and not args.judge_model:
            raise ValueError("--judge-base-url needs --judge-model")
        if args.audit_rule and args.no_judge:
            raise ValueError("--audit-rule asks the shared judge; it cannot run with --no-judge")
        sources, videos, subtitles = data_locations(args.data_dir, names)
        decoding = dataclasses.replace(PAPER_DECODING, max_new_tokens=args.max_new_tokens)
        api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        condition = resolve_condition(args.condition, args.checkpoint, args.base_url, args.model, api_key=api_key)
        logger.info(
            "evaluation condition: %s (%s)",
            "none, the shared prompt" if condition.condition is None else repr(condition.condition),
            condition.source,
        )
        options = EvalOptions(
            passes=args.passes,
            decoding=decoding,
            max_samples=args.max_samples,
            seed=args.seed,
            max_frames=args.max_frames,
            condition=condition.condition,
            condition_source=condition.source,
            concurrency=args.concurrency,
            sources=sources,
            video_dir=videos,
            subtitle_dir=subtitles,
            sampling_fields=args.sampling_fields,
            audit_rule=args.audit_rule,
        )
        client_args = dict(
            max_concurrency=args.concurrency,
            timeout=args.timeout,
            max_retries=args.max_retries,
            api_key_env=args.api_key_env,
        )
        student = TeacherClient(args.base_url, args.model, extra_body=args.extra_body, **client_args)
        judge = (
            None
            if args.no_judge
            else TeacherClient(args.judge_base_url, args.judge_model, extra_body=args.judge_extra_body, **client_args)
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        results = run_suite(names, student, judge, args.output_dir, options, run_name=args.run_name)
    except (ValueError, OSError) as err:  # bad data (a missing column, file or local copy), another run's directory
        print(f"error: {err}", file=sys.stderr)
        return 2
    except EvaluationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        student.close()
        if judge is not None:
            judge.close()
    _print_summary(results, args.output_dir)
    return 0


def _print_summary(results: dict, run_dir: Path) -> None:
    print(f"\n{results['run_name']} ({results['model']}), {results['passes']} pass(es):")
    for name, entry in results["settings"].items():
        score = "n/a" if entry["score"] is None else f"{entry['score']:.2f}" + (
            "" if entry["stderr"] is None else f" ± {entry['stderr']:.2f}")  # fmt: skip
        notes = [f"{entry['skipped']} skipped"] if entry["skipped"] else []
        notes += [f"{entry['judge_unparsed']} judge replies unparsed"] if entry["judge_unparsed"] else []
        notes += [] if entry["complete"] else ["partial"]
        print(f"  {name:<9} {score:>15}  n={entry['n']}" + (f"  ({', '.join(notes)})" if notes else ""))
        if entry.get("official_aggregates"):
            figures = ", ".join(f"{label} {value:.2f}" for label, value in entry["official_aggregates"].items())
            print(f"  {'':<9} the benchmark's own aggregation, not the score: {figures}")
        if entry.get("rule_audit"):
            audit = entry["rule_audit"]
            print(
                f"  {'':<9} rule audit: the judge scores 0 on {audit['judge_disagrees']} of {audit['checked']} "
                "rule-positive items" + (f" ({audit['judge_unparsed']} unparsed)" if audit["judge_unparsed"] else "")
            )
    for family, entry in results["families"].items():
        print(
            f"  {family.upper():<9} avg {entry['average']:.2f} over {entry['settings']} setting(s)"
            + ("" if entry["complete"] else " (partial)")
        )
    print(f"results: {run_dir / 'results.json'}; per-sample details: {run_dir / 'details'}/")


def main(argv: list[str] | None = None) -> int:
    """``zppo-eval {run,compare,rejudge,audit-traces,teacher-capability} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"run": run_main, "compare": _compare_main, "rejudge": _rejudge_main,
                "audit-traces": _audit_traces_main, "teacher-capability": _teacher_capability_main}  # fmt: skip
    if not argv or argv[0] not in commands:
        print("usage: zppo-eval {run,compare,rejudge,audit-traces,teacher-capability} [--help]\n"
              "  run                 evaluate a served checkpoint on the suite (resumable)\n"
              "  compare             the paper's tables (and bootstrap, plot) for several runs\n"
              "  rejudge             the judge sweep: runs' stored responses re-scored by another judge\n"
              "  audit-traces        a training run's trace-overlap audit (two of three judges)\n"
              "  teacher-capability  how often the teacher solves the student's hard questions",
              file=sys.stderr)  # fmt: skip
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return commands[argv[0]](argv[1:])


def _compare_main(argv: list[str]) -> int:
    from .report import compare_main

    return compare_main(argv)


def _rejudge_main(argv: list[str]) -> int:
    from .rejudge import rejudge_main

    return rejudge_main(argv)


def _audit_traces_main(argv: list[str]) -> int:
    from .trace_audit import audit_traces_main

    return audit_traces_main(argv)


def _teacher_capability_main(argv: list[str]) -> int:
    from .teacher_capability import teacher_capability_main

    return teacher_capability_main(argv)


if __name__ == "__main__":
    sys.exit(main())
