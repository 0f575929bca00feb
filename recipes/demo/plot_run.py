"""Plot a ZPPO run's replay buffer and reformulations per rollout step from its metrics.jsonl.

    python recipes/demo/plot_run.py outputs/demo            # writes outputs/demo/zppo_run.png

Panels: buffer occupancy; admissions and graduations; BCQ and NCQ instances; plain
accuracy. One point per rollout step (the log lines that carry `zppo/` metrics). Also
prints the run's totals, with a warning if BCQ or NCQ never happened.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zppo_trl.callbacks import read_metrics


def rollout_rows(rows: list[dict]) -> list[dict]:
    """The log rows that close a rollout step (they carry the zppo/ counters), one per step."""
    steps = {}
    for row in rows:
        if "zppo/rollout_steps" in row:
            steps[int(row["zppo/rollout_steps"])] = row  # a resumed run's repeat replaces the old one
    return [steps[k] for k in sorted(steps)]


def plot(metrics_path: Path, out_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rollout_rows(read_metrics(metrics_path))
    if not rows:
        raise SystemExit(f"{metrics_path} has no rollout-step metrics (zppo/ keys); did the run log any step?")
    x = [int(r["zppo/rollout_steps"]) for r in rows]

    def series(key):
        return [r.get(f"zppo/{key}", 0.0) for r in rows]

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    ax = axes[0][0]
    ax.plot(x, series("buffer_size"), marker="o", color="tab:purple")
    ax.set_title("replay buffer occupancy")
    ax.set_ylabel("residents")
    ax = axes[0][1]
    width = 0.4
    ax.bar([s - width / 2 for s in x], series("admitted"), width, label="admitted", color="tab:orange")
    ax.bar([s + width / 2 for s in x], series("graduated"), width, label="graduated", color="tab:green")
    ax.set_title("buffer admissions and graduations")
    ax.legend()
    ax = axes[1][0]
    ax.bar([s - width / 2 for s in x], series("bcq"), width, label="BCQ", color="tab:blue")
    ax.bar([s + width / 2 for s in x], series("ncq"), width, label="NCQ", color="tab:red")
    ax.set_title("reformulated instances (after the post-cap)")
    ax.legend()
    ax = axes[1][1]
    ax.plot(x, series("plain_accuracy"), marker="o", color="black")
    ax.set_ylim(0, 1)
    ax.set_title("plain accuracy (mean r_x)")
    for ax in axes[1]:
        ax.set_xlabel("rollout step")
    for ax in axes.flat:
        ax.set_xticks(x)
    totals = rows[-1]
    fig.suptitle(
        f"ZPPO run: {len(rows)} rollout steps, {int(totals.get('zppo/bcq_total', 0))} BCQ, "
        f"{int(totals.get('zppo/ncq_total', 0))} NCQ, {int(totals.get('zppo/graduated_total', 0))} graduated"
    )
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def summary(metrics_path: Path) -> list[str]:
    """The run's totals from its last rollout step, and a warning for a branch that never fired."""
    last = rollout_rows(read_metrics(metrics_path))[-1]
    total = {k: int(last.get(f"zppo/{k}_total", 0)) for k in ("admitted", "graduated", "bcq", "ncq", "skipped_partitions")}
    lines = [f"replay buffer: {int(last.get('zppo/buffer_size', 0))} residents; " + ", ".join(f"{k}: {v}" for k, v in total.items())]
    for kind in ("bcq", "ncq"):
        if not total[kind]:
            lines.append(f"warning: no {kind.upper()} instance this run (the teacher's and student's samples decide it); run it again")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: RUN_DIR/zppo_run.png)")
    args = parser.parse_args(argv)
    out = plot(args.run_dir / "metrics.jsonl", args.out or args.run_dir / "zppo_run.png")
    print(f"figure: {out}")
    print("\n".join(summary(args.run_dir / "metrics.jsonl")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
