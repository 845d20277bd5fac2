"""Figures from results and federations (matplotlib / seaborn), saved atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save ``fig`` to ``path`` (format from the suffix) through a temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, bbox_inches="tight", dpi=150)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a figure is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# Okabe & Ito's palette (distinguishable under every common colour-vision deficiency), black last
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
HATCHES = ("", "//", "..", "xx")  # beyond eight series the colours repeat with a hatch
STYLE = {
    "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO), "axes.formatter.useoffset": False,
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9,
    "legend.fontsize": 9, "figure.dpi": 100, "savefig.dpi": 150, "savefig.bbox": "tight",
    "axes.spines.top": False, "axes.spines.right": False,
}
RESOLUTION = 0.01  # a spread below this fraction of the axis' span cannot be seen on it: state the value


def use_style() -> None:
    """pflkit's figure defaults: the Okabe-Ito colours, no offset notation, fonts legible at notebook width."""
    matplotlib.rcParams.update(STYLE)


def series_style(k: int) -> dict:
    """Colour and hatch of series ``k`` (bars, areas): Okabe-Ito's colours, then the same with a hatch."""
    return {"color": OKABE_ITO[k % len(OKABE_ITO)], "hatch": HATCHES[(k // len(OKABE_ITO)) % len(HATCHES)]}


def visible_spread(values, span: float | None = None) -> bool:
    """Whether ``values``' spread (max - min) can be seen on an axis of ``span`` (default: the larger of the
    values' magnitude and 1e-12): at least `RESOLUTION` of it. Below that, state the value, do not plot it."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size < 2:
        return False
    span = span if span is not None else max(float(np.abs(v).max()), 1e-12)
    return float(v.max() - v.min()) >= RESOLUTION * span


def constant_statement(name: str, values, digits: int = 4) -> str:
    """``"beta = 0.0296 for every client (spread 4.8e-06)"``: a quantity too flat to plot, said in words."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return f"{name}: no values"
    return f"{name} = {v.mean():.{digits}g} for every client (spread {v.max() - v.min():.2g})"


def text_panel(ax, text: str) -> None:
    """Replace ``ax``'s drawing by a sentence (a quantity that does not vary, a panel with nothing to show)."""
    ax.cla()
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)


def plot_label_distribution(fed, split: str = "train", ax=None, max_clients: int = 50, title: str | None = None):
    """Stacked bars of each client's label counts (the picture of label shift): one client a bar, one class a
    colour (Okabe-Ito, hatched beyond eight), integer client ticks."""
    from matplotlib.ticker import MaxNLocator

    hist = fed.histograms(split)[:max_clients]
    if ax is None:
        _, ax = plt.subplots(figsize=(min(12, 3 + 0.3 * len(hist)), 3.6))
    bottom = np.zeros(len(hist))
    names = fed.meta.class_names
    for k in range(fed.num_classes):
        ax.bar(np.arange(len(hist)), hist[:, k], bottom=bottom, width=0.85, edgecolor="white", linewidth=0.3,
               label=names[k] if k < len(names) else str(k), **series_style(k))
        bottom += hist[:, k]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.6, len(hist) - 0.4)
    ax.set_ylim(0, 1.05 * max(float(bottom.max()), 1.0))
    ax.set_xlabel("client (index)")
    ax.set_ylabel(f"{split} samples (count)")
    ax.set_title(title or f"{fed.meta.name}: samples of each class per client")
    if fed.num_classes <= 20:
        ax.legend(title="class", ncol=min(fed.num_classes, 10), loc="upper center", bbox_to_anchor=(0.5, -0.2),
                  frameon=False)
    return ax


def plot_methods(results: dict, ax=None, paper_label: str = "paper", title: str | None = None):
    """Personalized accuracy per method: one bar each (mean over seeds, std over seeds as error bar when there
    are several) with its value printed, the paper's number as a black diamond named by ``paper_label``
    (say which dataset it is on when that is not the one plotted)."""
    methods = results["methods"]
    labels = list(methods)
    means = np.array([methods[m]["acc_mean"] if methods[m]["acc_mean"] is not None else np.nan for m in labels])
    stds = np.array([methods[m]["acc_std"] or 0.0 for m in labels])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 1.1 * len(labels), 3.8))
    cfg = results.get("config", {})
    x = np.arange(len(labels))
    bars = ax.bar(x, means, yerr=stds if stds.any() else None, color=OKABE_ITO[0], capsize=3,
                  label=f"pflkit (preset {cfg.get('preset')})")
    ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:.1f}" for v in means], label_type="center",
                 color="white", fontsize=9, fontweight="bold")
    for i in np.flatnonzero(np.isnan(means)):  # a method that is not ok has no bar: say so where it would be
        ax.text(x[i], 2, methods[labels[i]].get("status", "not ok"), ha="center", va="bottom", fontsize=8, rotation=90)
    paper = [methods[m].get("published") for m in labels]
    if any(p is not None for p in paper):
        ax.scatter(x, [np.nan if p is None else p for p in paper], color="k", marker="D", zorder=3,
                   label=paper_label)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylabel("personalized test accuracy (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title or f"{cfg.get('name')}: accuracy per method")
    return ax


def plot_per_client(results: dict, ax=None, title: str | None = None, seed_index: int = 0):
    """One box per method of its clients' test accuracies (seed ``seed_index``): the spread a mean hides."""
    labels = [k for k, m in results["methods"].items() if m.get("status") == "ok" and m.get("per_client")]
    values = [np.asarray(results["methods"][k]["per_client"][seed_index], dtype=float) for k in labels]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 1.1 * len(labels), 3.6))
    parts = ax.boxplot(values, tick_labels=labels, patch_artist=True, medianprops={"color": "black"})
    for k, box in enumerate(parts["boxes"]):
        box.set_facecolor(series_style(k)["color"])
    ax.set_ylabel("client test accuracy (%)")
    n = len(values[0]) if values else 0
    ax.set_title(title or f"{results.get('config', {}).get('name')}: test accuracy of each of the {n} clients")
    ax.tick_params(axis="x", rotation=20)
    return ax


def plot_client_values(values: dict[str, list], ylabel: str, title: str, span: float = 1.0, ax=None):
    """Each client's value of a learned quantity (one column of jittered dots per method). A method whose values
    do not vary visibly on an axis of ``span`` is not drawn but stated in the title (`constant_statement`);
    returns None when no method varies."""
    shown = [k for k, v in values.items() if visible_spread(v, span=span)]
    if not shown:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 2.2 * len(shown), 3.4))
    rng = np.random.default_rng(0)  # fixed jitter: the same picture every time
    for i, k in enumerate(shown):
        y = np.asarray([v for v in values[k] if v is not None], dtype=float)
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(y)), y, s=12, alpha=0.7, color=series_style(i)["color"],
                   label=f"{k} ({len(y)} clients)")
    ax.set_xticks(range(len(shown)), shown)
    ax.set_xlim(-0.6, len(shown) - 0.4)
    ax.set_ylabel(ylabel)
    flat = "; ".join(f"{k}: {constant_statement(ylabel.split(',')[0], v)}" for k, v in values.items() if k not in shown)
    ax.set_title(title + (f"\n{flat} (not drawn)" if flat else ""))
    ax.legend(loc="upper right")
    return ax


ROUND_METRICS = {"val_acc": "validation accuracy (%)", "train_loss": "training loss", "val_loss": "validation loss"}


def plot_rounds(results: dict, metric: str = "val_acc", ax=None, title: str | None = None):
    """A per-round metric of every trained stage (first seed); accuracies in %, as in every table. Every
    logged round is a marker, so a stage with one logged round still shows."""
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    scale = 100.0 if metric.endswith("acc") else 1.0
    for label, seeds in results["rounds"].items():
        hist = next(iter(seeds.values()), [])
        xs = [h["round"] for h in hist if h.get(metric) is not None]
        ys = [scale * h[metric] for h in hist if h.get(metric) is not None]
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(ROUND_METRICS.get(metric, metric + (" (%)" if scale != 1 else "")))
    if title:
        ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return ax
