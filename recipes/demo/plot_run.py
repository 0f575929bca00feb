"""Plot a ZPPO run from its metrics.jsonl and print what it did.

    python recipes/demo/plot_run.py outputs/demo/20261122-231500     # writes .../zppo_run.png

Panels, one point per rollout step (the log lines that carry `zppo/` metrics): replay buffer
occupancy; admissions and graduations; BCQ and NCQ groups trained, and how many of them
carried a learning signal (some rollouts right, some wrong); accuracies with the number of
rollouts behind each point. The printed summary gives the same totals, and says plainly
when no reformulated group carried a signal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zppo_trl.callbacks import read_metrics

KINDS = ("bcq", "ncq")


def rollout_rows(rows: list[dict]) -> list[dict]:
    """The log rows that close a rollout step (they carry the zppo/ counters), one per step."""
    steps = {}
    for row in rows:
        if "zppo/rollout_steps" in row:
            steps[int(row["zppo/rollout_steps"])] = row  # a resumed run's repeat replaces the old one
    return [steps[k] for k in sorted(steps)]


def totals(rows: list[dict]) -> dict:
    """Run totals from the rollout rows: counts, and the in-prompt accuracy of BCQ/NCQ rollouts."""
    last = rows[-1]
    out = {
        k: int(last.get(f"zppo/{k}_total", 0)) for k in ("admitted", "graduated", "bcq", "ncq", "skipped_partitions")
    }
    out["buffer"] = int(last.get("zppo/buffer_size", 0))
    for kind in KINDS:
        for what in ("trained", "signal", "correct", "rollouts"):
            out[f"{kind}_{what}"] = int(last.get(f"zppo/{kind}_{what}_total", 0))
    return out


def plot(rows: list[dict], out_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = [int(r["zppo/rollout_steps"]) for r in rows]

    def series(key):
        return [r.get(f"zppo/{key}", 0.0) for r in rows]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    width = 0.2
    ax = axes[0][0]
    ax.plot(x, series("buffer_size"), marker="o", color="tab:purple")
    ax.set_ylim(bottom=0)
    ax.set_title("replay buffer occupancy")
    ax.set_ylabel("residents")
    ax = axes[0][1]
    ax.bar([s - width / 2 for s in x], series("admitted"), width, label="admitted", color="tab:orange")
    ax.bar([s + width / 2 for s in x], series("graduated"), width, label="graduated", color="tab:green")
    ax.set_title("buffer admissions and graduations")
    ax.set_ylabel("questions")
    ax.legend()
    ax = axes[1][0]
    for offset, kind, color in ((-1.5, "bcq", "tab:blue"), (0.5, "ncq", "tab:red")):
        ax.bar(
            [s + offset * width for s in x],
            series(f"{kind}_trained"),
            width,
            label=f"{kind.upper()} groups",
            color=color,
            alpha=0.45,
        )
        ax.bar(
            [s + (offset + 1) * width for s in x],
            series(f"{kind}_signal"),
            width,
            label=f"{kind.upper()} with signal",
            color=color,
        )
    ax.set_title("reformulated groups trained, and those with a learning signal")
    ax.set_ylabel("groups")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    questions = [int(r.get("zppo/new", 0) + r.get("zppo/replayed", 0)) for r in rows]
    ax.plot(x, series("plain_accuracy"), marker="o", color="black", label="plain (mean r_x)")
    for step, accuracy, n in zip(x, series("plain_accuracy"), questions):
        ax.annotate(f"{n}q", (step, accuracy), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    for kind, color, shift in (("bcq", "tab:blue", -0.12), ("ncq", "tab:red", 0.12)):  # side by side, never hidden
        points = [
            (s + shift, r[f"zppo/{kind}_accuracy"], int(r.get(f"zppo/{kind}_rollouts", 0)))
            for s, r in zip(x, rows)
            if r.get(f"zppo/{kind}_trained")
        ]
        if points:
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="s",
                linestyle="none",
                color=color,
                label=f"{kind.upper()} in-prompt",
            )
            for step, accuracy, rollouts in points:
                ax.annotate(
                    f"n={rollouts}",
                    (step, accuracy),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                    color=color,
                )
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("accuracy (plain: questions per step; in-prompt: n rollouts)")
    ax.legend(fontsize=8)
    for ax in (axes[0][0], axes[0][1], axes[1][0]):  # counts: whole numbers only
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes.flat:
        ax.set_xticks(x)
    for ax in axes[1]:
        ax.set_xlabel("rollout step")
    t = totals(rows)
    fig.suptitle(
        f"ZPPO run: {len(rows)} rollout steps; {t['bcq_trained']} BCQ and {t['ncq_trained']} NCQ groups trained, "
        f"{t['bcq_signal'] + t['ncq_signal']} with signal; {t['graduated']} graduated"
    )
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def _accuracy(correct: int, rollouts: int) -> str:
    return f"{correct}/{rollouts} right ({correct / rollouts:.0%})" if rollouts else "no rollouts"


def summary(rows: list[dict]) -> list[str]:
    """The run's totals, the BCQ/NCQ groups that carried a signal, and what to make of none."""
    t = totals(rows)
    lines = [
        f"replay buffer: {t['buffer']} residents; admitted: {t['admitted']}, graduated: {t['graduated']}, "
        f"bcq: {t['bcq']}, ncq: {t['ncq']}, skipped_partitions: {t['skipped_partitions']}"
    ]
    for kind in KINDS:
        lines.append(
            f"{kind.upper()}: {t[f'{kind}_trained']} groups trained, {t[f'{kind}_signal']} with signal; in-prompt "
            f"{_accuracy(t[f'{kind}_correct'], t[f'{kind}_rollouts'])}"
        )
    if not t["bcq_trained"] + t["ncq_trained"]:
        lines.append(
            "warning: no BCQ or NCQ group this run (the teacher's and student's samples decide it); run it again"
        )
    elif not t["bcq_signal"] + t["ncq_signal"]:
        lines.append(
            "note: every BCQ/NCQ group was all right or all wrong, so none carried a learning signal "
            "(their advantages are 0); the plain groups did the training"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: RUN_DIR/zppo_run.png)")
    args = parser.parse_args(argv)
    rows = rollout_rows(read_metrics(args.run_dir / "metrics.jsonl"))
    if not rows:
        raise SystemExit(
            f"{args.run_dir / 'metrics.jsonl'} has no rollout-step metrics (zppo/ keys); did the run log any step?"
        )
    out = plot(rows, args.out or args.run_dir / "zppo_run.png")
    print(f"figure: {out}")
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
