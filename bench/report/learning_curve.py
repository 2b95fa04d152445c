"""Learning curves of finished runs, from their own ``metrics.jsonl``: the batch's mean reward,
the greedy held-out exact match, and for multi-turn runs the share of trajectories whose tool
call was right (``env/tool_ok``), one line per run.

    python -m shunter.bench.report.learning_curve runs/word-problems-XXXX runs/word-problems-tool-YYYY \\
        --out docs/word_problems.png

Invariant: every point is a figure the run recorded (no smoothing beyond the moving mean the
legend names), so the plot and the run's records always agree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PANELS = (
    ("batch/reward_mean", "sampled reward (batch mean)"),
    ("validate/exact", "greedy held-out exact"),
    ("env/tool_ok", "share with a right tool call"),
)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def series(rows: list[dict[str, Any]], key: str, window: int = 10) -> tuple[list[float], list[float]]:
    """(x, y) for ``key``: per optimizer step (moving mean over ``window`` steps) for step metrics,
    per weight version for validation."""
    if key.startswith("validate/"):
        pts = [(float(r["version"]), float(r[key])) for r in rows if key in r and "version" in r]
        return [x for x, _ in pts], [y for _, y in pts]
    pts = [(float(r["step"]), float(r[key])) for r in rows if key in r and "step" in r]
    ys = [y for _, y in pts]
    smooth = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    return [x for x, _ in pts], smooth


def plot(runs: list[Path], out: Path, window: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
    for i, run in enumerate(runs):
        rows = read_metrics(run)
        for ax, (key, _) in zip(axes, PANELS, strict=True):
            x, y = series(rows, key, window)
            if x:  # one colour per run in every panel
                ax.plot(x, y, label=run.name, color=f"C{i}")
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("weight version" if key.startswith("validate/") else "optimizer step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, title=f"moving mean of {window} steps", title_fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.jsonl)")
    ap.add_argument("--out", type=Path, default=Path("learning_curve.png"))
    ap.add_argument("--window", type=int, default=10)
    args = ap.parse_args(argv)
    print(plot(args.runs, args.out, args.window))


if __name__ == "__main__":
    main()
