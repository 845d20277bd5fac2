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


def plot_label_distribution(fed, split: str = "train", ax=None, max_clients: int = 50):
    """Stacked bars of each client's label counts (the picture of label shift)."""
    hist = fed.histograms(split)[:max_clients]
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14, 2 + 0.3 * len(hist)), 3.5))
    colors = sns.color_palette("tab20", fed.num_classes)
    bottom = np.zeros(len(hist))
    for k in range(fed.num_classes):
        ax.bar(np.arange(len(hist)), hist[:, k], bottom=bottom, color=colors[k], width=0.85,
               label=fed.meta.class_names[k] if k < len(fed.meta.class_names) else str(k))
        bottom += hist[:, k]
    ax.set_xlabel("client")
    ax.set_ylabel(f"{split} samples")
    ax.set_title(f"{fed.meta.name}: {fed.recipe.get('scheme')} {fed.recipe.get('options', {})}")
    if fed.num_classes <= 20:
        ax.legend(ncol=min(fed.num_classes, 10), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    return ax


def plot_methods(results: dict, ax=None):
    """Personalized accuracy per method (mean over seeds, std as error bar), paper's number as a dot."""
    methods = results["methods"]
    labels = list(methods)
    means = [methods[m]["acc_mean"] if methods[m]["acc_mean"] is not None else np.nan for m in labels]
    stds = [methods[m]["acc_std"] or 0.0 for m in labels]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 1.1 * len(labels), 3.5))
    ax.bar(labels, means, yerr=stds, color=sns.color_palette("muted", len(labels)), capsize=3, label="pflkit")
    paper = [methods[m].get("published") for m in labels]
    if any(p is not None for p in paper):
        ax.scatter(labels, [np.nan if p is None else p for p in paper], color="k", zorder=3, label="paper")
        ax.legend(fontsize=8)
    cfg = results.get("config", {})
    ax.set_ylabel("personalized accuracy (%)")
    ax.set_title(f"{cfg.get('name')} - preset {cfg.get('preset')}")
    ax.tick_params(axis="x", rotation=20)
    return ax


ROUND_METRICS = {"val_acc": "validation accuracy (%)", "train_loss": "training loss", "val_loss": "validation loss"}


def plot_rounds(results: dict, metric: str = "val_acc", ax=None):
    """A per-round metric of every trained stage (first seed); accuracies in %, as in every table."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    scale = 100.0 if metric.endswith("acc") else 1.0
    for label, seeds in results["rounds"].items():
        hist = next(iter(seeds.values()), [])
        xs = [h["round"] for h in hist if h.get(metric) is not None]
        ys = [scale * h[metric] for h in hist if h.get(metric) is not None]
        if xs:
            ax.plot(xs, ys, marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(ROUND_METRICS.get(metric, metric + (" (%)" if scale != 1 else "")))
    ax.legend(fontsize=8)
    return ax
