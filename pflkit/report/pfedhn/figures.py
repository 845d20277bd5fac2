"""pFedHN's figures from saved or committed runs, and the sentences that read them: the training curves of
`01_method`, the mix-and-match heatmap of Fig. 3, the client embeddings of Fig. 4, the novel clients of
Fig. 2 / 7, and the committed figure files that results mode shows where the compact results do not hold the
trained states. Its tables: `pflkit.report.pfedhn.tables`.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from pflkit.analysis.pfedhn import tv_to_nearest

__all__ = ["committed_figure", "show_figure", "plot_training", "training_reading", "plot_mix_and_match",
           "mix_and_match_reading", "plot_tsne", "embedding_reading", "plot_novel_clients", "novel_reading",
           "novel_arrays", "novel_clients_table", "tv_column"]


# ---------------------------------------------------------------- committed figure files


def committed_figure(name: str, results_dir: str | os.PathLike | None = None, folder: str = "pfedhn") -> Path | None:
    """The committed ``figures/<folder>/<name>`` of the checkout whose ``results/`` is ``results_dir``
    (``results/<preset>``), else of the checkout pflkit runs from; None when there is none."""
    roots = [Path(results_dir).resolve().parents[1]] if results_dir else []
    roots.append(Path(__file__).resolve().parents[3])  # the checkout: above pflkit/report/pfedhn/
    for root in roots:
        path = root / "figures" / folder / name
        if path.is_file():
            return path
    return None


def show_figure(path: Path | None, caption: str, missing: str) -> None:
    """Show a committed figure file with its caption (Markdown), or the sentence ``missing`` when there is none.

    Results mode uses it for the figures that need trained states the compact results do not keep."""
    from IPython.display import Image, Markdown, display

    if path is None:
        display(Markdown(missing))
        return
    display(Image(filename=str(path)))
    display(Markdown(caption))


# ---------------------------------------------------------------- 01_method: training curves


def plot_training(history: list[dict], hnet_bytes: int, title: str):
    """Validation accuracy per server step (left) of one pFedHN run's history rows (``round``, ``val_acc``,
    ``bytes_down``, ``bytes_up``), and (right, log scale) what one step sends, the target network down and its
    update up (mean over steps), beside what sending the hypernetwork both ways would cost. The bytes per
    step do not change over a run, so they are bars, not a flat line over steps."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO

    val = [r for r in history if r.get("val_acc") is not None]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    ax[0].plot([r["round"] for r in val], [100 * r["val_acc"] for r in val], marker="o", markersize=3,
               color=OKABE_ITO[0], label="pFedHN, mean over clients")
    ax[0].set_xlabel("server step (one client per step)")
    ax[0].set_ylabel("validation accuracy (%)")
    ax[0].set_title("validation accuracy")
    ax[0].legend(loc="lower right")
    sent = float(np.mean([r["bytes_down"] + r["bytes_up"] for r in history])) / 2**10
    labels, values = ["target network\n(what pFedHN sends)"], [sent]
    if hnet_bytes:
        labels.append("hypernetwork\n(never sent)")
        values.append(2 * hnet_bytes / 2**10)
    bars = ax[1].bar(labels, values, color=[OKABE_ITO[0], OKABE_ITO[3]][: len(values)], width=0.6)
    ax[1].bar_label(bars, labels=[f"{v:,.0f} KiB" for v in values], padding=2)
    ax[1].set_yscale("log")
    ax[1].set_ylim(min(values) / 10, 8 * max(values))  # a log bar needs a floor below its smallest value
    ax[1].set_ylabel("KiB per step, down + up (log scale)")
    ax[1].set_title("communication per server step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def training_reading(history: list[dict], hnet_bytes: int) -> str:
    """What `plot_training` shows, from the same rows."""
    val = [r for r in history if r.get("val_acc") is not None]
    if not val:
        return "No validation pass was logged in this run, so there is no curve to read."
    best = max(val, key=lambda r: r["val_acc"])
    sent = np.mean([r["bytes_down"] + r["bytes_up"] for r in history])
    return (f"Validation accuracy goes from {100 * val[0]['val_acc']:.1f}% at step {val[0]['round']} to its best, "
            f"{100 * best['val_acc']:.1f}%, at step {best['round']} of {history[-1]['round']}. Each step sends "
            f"{sent / 2**10:.0f} KiB (the target network down and its update up), {2 * hnet_bytes / sent:.0f} "
            "times less than sending the hypernetwork would.")


# ---------------------------------------------------------------- Fig. 3: mix and match


def plot_mix_and_match(acc, labels: list[str], title: str):
    """Fig. 3: row-normalized accuracy of client i's data and classifier with client j's feature extractor,
    the diagonal (each client's own extractor) outlined and named in the legend; values printed in black or
    white by the cell's brightness."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch, Rectangle

    from pflkit.analysis.pfedhn import row_normalize

    n = len(acc)
    fig, ax = plt.subplots(figsize=(8, 6.8))
    sns.heatmap(row_normalize(acc), annot=n <= 12, fmt=".2f", cmap="viridis", vmin=0, vmax=1, square=True,
                xticklabels=labels, yticklabels=labels, ax=ax, annot_kws={"fontsize": 9},
                cbar_kws={"label": "row-normalized accuracy (0 = row's worst, 1 = row's best)", "shrink": 0.8})
    for i in range(n):
        ax.add_patch(Rectangle((i, i), 1, 1, fill=False, edgecolor="#D55E00", linewidth=2.5))
    ax.legend(handles=[Patch(facecolor="none", edgecolor="#D55E00", linewidth=2.5,
                             label="diagonal: the client's own feature extractor")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.tick_params(axis="y", rotation=0)
    ax.tick_params(axis="x", rotation=90)
    ax.set_xlabel("feature extractor of client j (its two classes)")
    ax.set_ylabel("client i: its test data and classifier (its two classes)")
    ax.set_title(title, pad=26)
    fig.tight_layout()
    return fig


def mix_and_match_reading(acc) -> str:
    """What Fig. 3 shows, from the raw accuracy matrix (rows: client i, columns: feature extractor j)."""
    a = np.asarray(acc, dtype=float)
    n = len(a)
    off = a[~np.eye(n, dtype=bool)]
    best = int(sum(a[i, i] >= a[i].max() for i in range(n)))
    span = 100 * float((a.max(1) - a.min(1)).mean())
    return (f"With its own feature extractor a client reaches {100 * np.diag(a).mean():.1f}% on average, with "
            f"another client's {100 * off.mean():.1f}%; a row's best and worst extractor differ by {span:.1f} points "
            f"on average, the whole range the colours stretch to 0-1. The diagonal is its row's best (1.00) in "
            f"{best} of {n} rows"
            + (": the extractors are personal, as in the paper's Fig. 3." if best == n else
               "; in the paper it is the best in every row. Where it is not, another client's extractor serves this "
               "client's two classes at least as well, so those extractors are not personal to their clients."))


# ---------------------------------------------------------------- Fig. 4: t-SNE of client embeddings


def plot_tsne(xy, groups, names, title: str, group: str = "group"):
    """Fig. 4: the 2-D t-SNE of the client embeddings, one colour and marker per group (Okabe-Ito, legend
    outside). t-SNE's axes have no unit: only which points are near each other means something."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO

    xy, g = np.asarray(xy), np.asarray(groups)
    markers = "osD^v<>p"
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for k, grp in enumerate(np.unique(g)):
        sel = g == grp
        ax.scatter(xy[sel, 0], xy[sel, 1], s=55, color=OKABE_ITO[k % len(OKABE_ITO)],
                   marker=markers[(k // len(OKABE_ITO)) % len(markers)] if len(np.unique(g)) > 8 else markers[k % 8],
                   edgecolor="k", linewidth=0.4, label=str(names[grp]).replace("_", " "))
    ax.set_xlabel("t-SNE dimension 1 (no unit)")
    ax.set_ylabel("t-SNE dimension 2 (no unit)")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(title=group, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- Fig. 4: what the embeddings show


def embedding_reading(report: dict, group: str = "alphabet") -> str:
    """What the t-SNE of Fig. 4 shows, from `pflkit.analysis.embeddings.embedding_report` of the embeddings
    themselves (not of the 2-D projection, which t-SNE distorts)."""
    agree, chance, sil = report["neighbour_agreement"], report["chance"], report["silhouette"]
    verdict = ("well above chance: clients with the same " + group + " got nearby embeddings"
               if agree >= 2 * chance else "near chance: the embeddings have not organized by " + group)
    return (f"For {100 * agree:.0f}% of the clients the nearest other embedding belongs to a client of the same "
            f"{group} (chance: {100 * chance:.0f}%), {verdict}. The silhouette of the {group} groups is {sil:.2f} "
            "(1: tight, separate groups; 0: overlapping), so the groups "
            + ("are clearly separated." if sil >= 0.25 else "touch or overlap."))


# ---------------------------------------------------------------- Fig. 2 / 7: novel clients


def tv_column(basis: str) -> str:
    """The name of Fig. 2's distance column for a TV ``basis`` (`pflkit.analysis.pfedhn.tv_to_nearest`)."""
    return f"TV to the nearest training client ({basis})"


def novel_arrays(results: dict, run_dir, label: str = "pFedHN") -> dict:
    """The first seed's report of ``label`` in a run with unseen clients: from the compact result's ``analysis``
    (a committed result), else from the run folder's report files (a run made here, `pflkit.report.compact.analysis`).
    A result made before the batch fitted novel clients has none: a one-line error says to rerun it."""
    from pflkit.report.compact import analysis

    kept = results.get("analysis", {}).get(label, {}).get("seeds")
    if kept is None and run_dir is not None and os.path.isdir(run_dir):
        kept = analysis(run_dir, results).get(label, {}).get("seeds")
    if not kept or "novel" not in kept[0]:
        name = results.get("experiment", "the experiment")
        raise ValueError(f"{name}: this result keeps no novel clients' report (data.unseen_clients); rerun it with "
                         f"`pflkit reproduce --only {name}`")
    return kept[0]


def novel_clients_table(results: dict, arrays: dict, label: str = "pFedHN",
                        tv_basis: str = "p_hat") -> tuple[pd.DataFrame, float]:
    """Fig. 2's points from a run with unseen clients (`pflkit.algorithms.pfedhn.fit_unseen`): one row per novel
    client with its alpha, TV to the nearest training client (computed on ``tv_basis`` from the class histograms
    its report keeps), that client, its test accuracy after the embedding fit, the gap to the training clients'
    mean, and how the fit ended (``updates``, ``converged``); and that mean (a fraction, as `novel_reading` takes).

    ``arrays``: the stage's report for one seed (the compact result's ``analysis[label]["seeds"][k]``).
    """
    novel = arrays["novel"]
    ids = list(novel["clients"])
    hist = np.asarray(novel["train_histograms"])
    seen = [i for i in range(len(hist)) if i not in set(ids)]
    tv, nearest = tv_to_nearest(hist[seen], hist[ids], basis=tv_basis)
    acc = np.asarray(results["methods"][label]["per_client"][0], dtype=float)  # % per client, seed 0
    acc_train = float(acc[seen].mean())
    alphas = np.asarray(results["config"]["data"]["partition"]["alpha"], dtype=float)
    table = pd.DataFrame({"client": ids, "alpha": alphas[ids], tv_column(tv_basis): tv,
                          "nearest training client": [seen[j] for j in nearest], "accuracy (%)": acc[ids],
                          "gap (%)": acc[ids] - acc_train, "updates": novel["steps"], "converged": novel["converged"]})
    return table, acc_train / 100


def plot_novel_clients(table: pd.DataFrame, tv: str, title: str):
    """Fig. 2 (left): the generalization gap acc_novel - acc_train per novel-client alpha against the mean
    total variation to the nearest training client, points in order of TV; Fig. 7 (right): one point per
    novel client, one Okabe-Ito colour and marker per alpha, named in the legend. ``table`` has the columns
    ``alpha``, ``tv``, ``accuracy (%)`` and ``gap (%)``."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO

    by_alpha = table.groupby("alpha").mean(numeric_only=True).sort_values(tv)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(by_alpha[tv], by_alpha["gap (%)"], color="0.5", lw=1, zorder=1)
    markers = "osD^v<>p"
    alphas = sorted(table["alpha"].unique())
    style = {a: (OKABE_ITO[k % len(OKABE_ITO)], markers[k % len(markers)]) for k, a in enumerate(alphas)}
    for a, row in by_alpha.sort_index().iterrows():  # the legend in order of alpha, the line in order of TV
        ax[0].scatter(row[tv], row["gap (%)"], color=style[a][0], marker=style[a][1], s=60, zorder=2,
                      edgecolor="k", linewidth=0.4, label=f"α = {a:g}")
    ax[0].axhline(0, color="k", lw=0.6, ls=":", label="no gap")
    ax[0].set_xlabel(f"mean {tv} (0 to 1)")
    ax[0].set_ylabel("acc_novel − acc_train (percentage points)")
    ax[0].set_title("Fig. 2: generalization gap, mean per α")
    ax[0].legend(title="novel clients", loc="best")
    for a, rows in table.groupby("alpha"):
        ax[1].scatter(rows[tv], rows["accuracy (%)"], color=style[a][0], marker=style[a][1], s=60,
                      edgecolor="k", linewidth=0.4, label=f"α = {a:g}")
    ax[1].set_xlabel(f"{tv} (0 to 1)")
    ax[1].set_ylabel("novel client's test accuracy (%)")
    ax[1].set_title("Fig. 7: one point per novel client")
    ax[1].legend(title="novel clients", loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def novel_reading(table: pd.DataFrame, tv: str, acc_train: float) -> str:
    """What `plot_novel_clients` shows: the mean gap, and whether it grows with the TV as in the paper."""
    by_alpha = table.groupby("alpha").mean(numeric_only=True).sort_values(tv)
    gaps = by_alpha["gap (%)"].to_numpy()
    worse = bool(np.all(np.diff(gaps) <= 0))
    rho = float(np.corrcoef(table[tv], table["accuracy (%)"])[0, 1]) if len(table) > 2 else float("nan")
    return (f"The training clients average {100 * acc_train:.1f}%; the novel clients "
            f"{table['accuracy (%)'].mean():.1f}%, a gap of {table['gap (%)'].mean():+.1f} points. Ordered by "
            f"their mean TV, the α groups' gaps are {', '.join(f'{g:+.1f}' for g in gaps)}: "
            + ("the gap widens as the novel clients move away from the training ones, as in the paper."
               if worse else "not a steady widening with the distance, which the paper's Fig. 2 shows.")
            + f" Per client, the correlation of accuracy with TV is {rho:.2f}.")
