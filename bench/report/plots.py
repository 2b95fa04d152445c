"""The bench report's PNG plots (``bench/report/markdown.py``; matplotlib, headless): per scenario the
speedup and idle bars, the gap split, and the reward curves (vs step, vs wall time, vs the
staleness bound).

Invariant: a plot draws only what the result JSON holds (medians, min-max over seeds, means
over seeds of the saved curves) and is written beside that JSON, so the report can be rebuilt
from the results at any time; matplotlib is imported only when a plot is drawn (Agg backend).
"""

from __future__ import annotations

from pathlib import Path

from shunter.bench.analysis.gap import PARTS


def plot(result: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = result["scenario"]["scenario"]["name"]
    metrics = result["metrics"]
    made = []
    base = result["scenario"]["scenario"].get("baseline", "")
    key = f"speedup_vs_{base}"
    if base and any(key in m for m in metrics.values()):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(metrics)
        med = [metrics[n].get(key, {}).get("median", 0) for n in names]
        lo = [med[i] - metrics[n].get(key, {}).get("min", 0) for i, n in enumerate(names)]
        hi = [metrics[n].get(key, {}).get("max", 0) - med[i] for i, n in enumerate(names)]
        ax.barh(names, med, xerr=[lo, hi], color="#4c72b0")
        ax.axvline(1.0, color="grey", lw=1)
        ax.set_xlabel(f"speedup vs {base} (median, min–max over seeds)")
        made.append(_save(plt, fig, ax, out_dir / f"{name}-speedup.png"))
    if any("trainer_idle_frac" in m for m in metrics.values()):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(metrics)
        y = range(len(names))
        med = [(metrics[n].get("trainer_idle_frac", {}), metrics[n].get("rollout_idle_frac", {})) for n in names]
        ax.barh([i - 0.2 for i in y], [t.get("median", 0.0) for t, _ in med], 0.4, label="trainer")  # 0: not measured
        ax.barh([i + 0.2 for i in y], [r.get("median", 0.0) for _, r in med], 0.4, label="rollout")
        ax.set_yticks(list(y), names)
        ax.set_xlabel("idle fraction of wall time (median)")
        ax.legend()
        made.append(_save(plt, fig, ax, out_dir / f"{name}-idle.png"))
    if any("gap_split_s" in m for m in metrics.values()):
        fig, ax = plot_gaps(plt, metrics)
        made.append(_save(plt, fig, ax, out_dir / f"{name}-gap.png"))
    return made


GAP_COLORS = {
    "split": "#8c8c8c",
    "first_batch": "#4c72b0",
    "gate": "#dd8452",
    "end_of_run": "#55a868",
    "deadline": "#8172b3",
    "switches": "#937860",
    "rollout": "#da8bc3",
    "trainer_switches": "#ccb974",
    "tail": "#64b5cd",
    "other": "#dddddd",
}


def plot_gaps(plt, metrics: dict[str, dict]) -> tuple:
    """One stacked bar per variant: its gap parts (medians over seeds) as fractions of the best
    split's bound; a negative part (lending beating every split, the run ahead of the bound's
    waits) is drawn left of zero."""
    names = [n for n, m in metrics.items() if "gap_split_s" in m]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    pos, neg = [0.0] * len(names), [0.0] * len(names)
    for part in PARTS:
        vals = []
        for n in names:
            m = metrics[n]
            vals.append(m[f"gap_{part}_s"]["median"] / m["best_split_bound_s"]["median"])
        lefts = [neg[i] + v if v < 0 else pos[i] for i, v in enumerate(vals)]
        ax.barh(names, [abs(v) for v in vals], left=lefts, color=GAP_COLORS[part], label=part)
        for i, v in enumerate(vals):
            if v < 0:
                neg[i] += v
            else:
                pos[i] += v
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("wall time above the best split's bound, by cause (fraction of that bound, median)")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    return fig, ax


def smooth(xs: list[float], k: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def mean_curve(runs: list[dict], key: str) -> tuple[list[float], list[float]]:
    """Mean over seeds of ``key`` per optimizer step (up to the shortest run)."""
    n = min(len(r["step"]) for r in runs)
    return runs[0]["step"][:n], [sum(r[key][i] for r in runs) / len(runs) for i in range(n)]


def plot_curves(result: dict, out_dir: Path) -> list[Path]:
    """Reward vs optimizer step and vs wall time per variant (mean over seeds, moving average
    of 10 steps); for ``eta=<n> <objective>`` variants, reward per step vs the staleness bound."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, name = result.get("curves") or {}, result["scenario"]["scenario"]["name"]
    curves = {v: runs for v, runs in curves.items() if runs}
    if not curves:
        return []
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (variant, runs) in enumerate(curves.items()):
        color = cmap(i / max(1, len(curves) - 1))
        style = "--" if "decoupled" in variant else "-"
        steps, reward = mean_curve(runs, "reward")
        _, wall = mean_curve(runs, "wall_s")
        axes[0].plot(steps, smooth(reward), style, color=color, label=variant)
        axes[1].plot(wall, smooth(reward), style, color=color, label=variant)
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("sampled reward")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{name}: mean over seeds, 10-step moving average", fontsize=9)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    made = [out_dir / f"{name}-reward.png"]
    fig.savefig(made[0], dpi=110)
    plt.close(fig)
    by: dict[str, list[tuple[int, float]]] = {}
    for variant, m in result["metrics"].items():
        hit = re.fullmatch(r"eta=(\d+) (\S+)", variant)
        if hit and "reward_avg" in m:
            by.setdefault(hit.group(2), []).append((int(hit.group(1)), m["reward_avg"]["median"]))
    if by:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for obj, pts in by.items():
            pts.sort()
            ax.plot([str(e) for e, _ in pts], [r for _, r in pts], "o-" if obj != "decoupled" else "s--", label=obj)
        ax.set_xlabel("max staleness (versions)")
        ax.set_ylabel("reward per step (median over seeds)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        made.append(out_dir / f"{name}-summary.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def _save(plt, fig, ax, path: Path) -> Path:
    ax.invert_yaxis()  # variants top to bottom in scenario order
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
