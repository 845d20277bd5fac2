"""pFedVEM's Table 1 and the server's trust in each client (Alg. 1, Eq. 7) from a saved run.

Pure functions of what `pflkit run` writes for a ``pfedvem_*`` experiment: ``results.json`` (each
method's personalized accuracy per seed) and ``seed{S}/<method>.report.json`` (pFedVEM's and pFedMAP's
`trust_report`: n_j, rho_j^2 and its two parts, the share of tau_j = 1 / rho_j^2 in w).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pflkit.io import read_json, slug

__all__ = ["table1", "trust_frame", "trust_from_analysis", "trust_reading", "plot_trust", "table1_reading",
           "plot_table1", "head_size", "method_option", "trust_terms", "trust_takeaway"]
# the trust report's keys as the notebook names its columns
TRUST_COLUMNS = {"trace_per_dim": "Tr(Sigma)/D", "dist2_per_dim": "||mu-w||^2/D", "tau_share": "trust tau_j (share)"}


def table1(results: dict) -> pd.DataFrame:
    """Table 1 for one run: per method the mean over seeds of the personalized accuracy (%, mean over
    clients of each client's test accuracy), its standard error (SEM, what the paper reports), the
    standard deviation over seeds (SD, ``ddof=1``; NaN for one seed), the number of seeds counted, of how
    many were run, the method's status (``ok`` only when every seed finished) and the published number.
    A seed that did not finish with ``ok`` has no accuracy and is not counted."""
    rows = {}
    for label, m in results["methods"].items():
        accs = np.array([a for a in m.get("per_seed", []) if a is not None], dtype=np.float64)
        sd = float(accs.std(ddof=1)) if len(accs) > 1 else np.nan
        rows[label] = {"ours (%)": float(accs.mean()) if len(accs) else np.nan,
                       "SEM": sd / np.sqrt(len(accs)) if len(accs) else np.nan, "SD": sd, "seeds": len(accs),
                       "of": len(m.get("per_seed", [])), "status": m.get("status", "ok"),
                       "paper (%)": m.get("published")}
    return pd.DataFrame.from_dict(rows, orient="index")


def trust_frame(run_dir, results: dict, label: str = "pFedVEM", seed: int | None = None) -> pd.DataFrame:
    """The trust report of ``label`` for one seed (default: the run's first), one row per client:
    ``n_train``, ``rho2`` (Eq. 7 against the final w), ``Tr(Sigma)/D``, ``||mu-w||^2/D``, ``trust tau_j
    (share)`` and the client's ``test acc`` (a fraction) from ``results``."""
    cfg = results["config"]
    seed = cfg["seed"] if seed is None else seed
    path = Path(run_dir) / f"seed{seed}" / f"{slug(label)}.report.json"
    if not path.exists():
        raise FileNotFoundError(f"no trust report at {path}: did {label!r} finish in this run?")
    return _trust(read_json(path), results, label, seed)


# ----------------------------------------------------------------------------- from the compact results

def trust_from_analysis(results: dict, label: str = "pFedVEM", seed: int | None = None) -> pd.DataFrame:
    """`trust_frame` from the run's ``analysis`` (the compact result's copy of each seed's trust report,
    `pflkit.report.compact.analysis`), so a committed result draws the trust figure with no run folder."""
    cfg = results["config"]
    seed = cfg["seed"] if seed is None else seed
    seeds = ((results.get("analysis") or {}).get(label) or {}).get("seeds") or []
    report = next((s for s in seeds if s.get("seed") == seed), None)
    if report is None:
        raise KeyError(f"{label!r} has no trust report for seed {seed} in these results")
    return _trust(report, results, label, seed)


def _trust(report: dict, results: dict, label: str, seed: int) -> pd.DataFrame:
    keys = ("n_train", "rho2", "trace_per_dim", "dist2_per_dim", "tau_share")
    frame = pd.DataFrame({k: report[k] for k in keys}).rename(columns=TRUST_COLUMNS)
    per_client = results["methods"][label]["per_client"][seed - results["config"]["seed"]]
    frame["test acc"] = [a / 100.0 for a in per_client]
    frame.index.name = "client"
    return frame


def method_option(results: dict, label: str, key: str):
    """Option ``key`` of method ``label`` in the run's config (e.g. pFedVEM's ``init_scale``)."""
    methods = results["config"]["methods"]
    rows = methods.values() if isinstance(methods, dict) else methods
    return next(m for m in rows if m.get("label") == label)[key]


def head_size(model) -> int:
    """D of Eq. 7: the number of entries of the personalized linear classifier (weights and bias)."""
    from pflkit.models import head_param_names

    names = set(head_param_names(model))
    return sum(p.numel() for n, p in model.named_parameters() if n in names)


def trust_terms(frame: pd.DataFrame, init_scale: float) -> dict:
    """What decides rho_j^2 (Eq. 7) across clients: the spread (std over clients) of each of its two parts,
    their correlation with the client's train size n_j, the range of tau_j's weight in w relative to equal
    weights (%), and how far Tr(Sigma_j)/D moved from its start ``init_scale**2`` (largest change, relative)."""
    n = frame["n_train"].to_numpy(dtype=float)
    trace, dist = frame["Tr(Sigma)/D"].to_numpy(), frame["||mu-w||^2/D"].to_numpy()
    rel = 100 * (frame["trust tau_j (share)"].to_numpy() * len(frame) - 1)
    corr = (lambda v: float(np.corrcoef(v, n)[0, 1]) if np.std(v) > 0 and np.std(n) > 0 else float("nan"))
    return {"n_min": int(n.min()), "n_max": int(n.max()), "n_median": float(np.median(n)),
            "trace_std": float(trace.std()), "dist_std": float(dist.std()),
            "trace_corr_n": corr(trace), "dist_corr_n": corr(dist), "rho_corr_n": corr(frame["rho2"].to_numpy()),
            "trace_moved": float(np.abs(trace / init_scale ** 2 - 1).max()),
            "tau_min": float(rel.min()), "tau_max": float(rel.max())}


def trust_reading(frame: pd.DataFrame, init_scale: float, head_entries: int | None) -> str:
    """The trust figure in words, generated from ``frame``: which part of rho_j^2 varies more across
    clients, how each follows n_j, and how far the server's weights move from equal. ``head_entries``
    (D of Eq. 7) is None when the model could not be built (no dataset)."""
    t = trust_terms(frame, init_scale)
    decides = "distance" if t["dist_std"] > t["trace_std"] else "uncertainty"
    d = f"$D = {head_entries}$ head entries" if head_entries else "the head's $D$ entries"
    return (f"The clients hold {t['n_min']} to {t['n_max']} training images (median {t['n_median']:g}) for "
            f"{d}: $\\mathrm{{Tr}}\\,\\Sigma_j/D$ "
            f"stays within {100 * t['trace_moved']:.1f}% of its start $\\sigma_0^2 = {init_scale ** 2:.4g}$ "
            f"(std over clients {t['trace_std']:.2g}; correlation with $n_j$ {t['trace_corr_n']:+.2f}). "
            f"The distance term $\\|\\mu_j - w\\|^2/D$ varies {t['dist_std'] / max(t['trace_std'], 1e-30):.1f} "
            f"times as much (std {t['dist_std']:.2g}; correlation with $n_j$ {t['dist_corr_n']:+.2f}), so the "
            f"**{decides}** term decides $\\rho_j^2$ (correlation of $\\rho_j^2$ with $n_j$: "
            f"{t['rho_corr_n']:+.2f}). The server's weights $\\tau_j / \\sum_i \\tau_i$ range from "
            f"{t['tau_min']:+.1f}% "
            f"to {t['tau_max']:+.1f}% around equal weights $1/J$.")


def trust_takeaway(frame: pd.DataFrame, init_scale: float, head_entries: int | None) -> str:
    """A Takeaways bullet on the server's trust, generated from ``frame``: how far tau_j moved from equal,
    and whether the amount of data (the uncertainty term) or the distance from w decided it."""
    t = trust_terms(frame, init_scale)
    text = (f"- Trust: the server's weights $\\tau_j$ end between {t['tau_min']:+.1f}% and {t['tau_max']:+.1f}% of "
            f"equal weights. ")
    if t["dist_std"] <= t["trace_std"]:
        return text + ("The uncertainty term $\\mathrm{Tr}\\,\\Sigma_j/D$ varies more across clients than the distance "
                       "term: here the client's own uncertainty, not its distance from $w$, sets its weight.")
    d = f"{head_entries} head entries" if head_entries else "the head's entries"
    return text + (f"With {t['n_min']} to {t['n_max']} images per client for {d}, $\\mathrm{{Tr}}\\,\\Sigma_j/D$ "
                   f"moved at most {100 * t['trace_moved']:.1f}% from its start, so the trust follows the distance "
                   "from $w$, not the amount of data. The paper's clients hold far more images each (its Table 1, "
                   "'# Samples/Clients'), where the uncertainty term can shrink: this preset cannot show that.")


def plot_trust(frame: pd.DataFrame, init_scale: float, title: str):
    """Three panels against the client's train size n_j: rho_j^2 (Eq. 7); its two parts, each as a change
    (the uncertainty term minus its start ``init_scale**2``, and the distance term); the client's weight
    tau_j in w relative to equal weights (%)."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO

    n = frame["n_train"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    axes[0].scatter(n, 1e3 * frame["rho2"], color=OKABE_ITO[0], s=18, label="one client")
    axes[0].set_ylabel(r"$\rho_j^2$ ($\times 10^{-3}$)")
    axes[0].set_title(r"each client's spread $\rho_j^2$ (Eq. 7)")
    scale = 1e5
    axes[1].scatter(n, scale * (frame["Tr(Sigma)/D"] - init_scale ** 2), color=OKABE_ITO[1], marker="s", s=18,
                    label=r"$\mathrm{Tr}\,\Sigma_j/D - \sigma_0^2$ (uncertainty, change from start)")
    axes[1].scatter(n, scale * frame["||mu-w||^2/D"], color=OKABE_ITO[2], marker="o", s=18,
                    label=r"$\|\mu_j - w\|^2/D$ (distance from $w$)")
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set_ylabel(r"term of $\rho_j^2$ ($\times 10^{-5}$)")
    axes[1].set_title(r"its two parts")
    axes[2].scatter(n, 100 * (frame["trust tau_j (share)"] * len(frame) - 1), color=OKABE_ITO[3], marker="D",
                    s=18, label="one client")
    axes[2].axhline(0, color="k", lw=0.8, label="equal weights")
    axes[2].set_ylabel(r"weight $\tau_j$ in $w$ vs equal (%)")
    axes[2].set_title(r"the server's trust $\tau_j = 1/\rho_j^2$")
    for ax in axes:
        ax.set_xlabel("client's training images $n_j$ (count)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, frameon=False)
    fig.suptitle(title)
    return fig


def table1_reading(table: pd.DataFrame, ours: str = "pFedVEM") -> str:
    """Table 1 in words: the best finished method, ``ours``'s place and gap, and the methods left partial."""
    done = table[table["status"] == "ok"]["ours (%)"].dropna().sort_values(ascending=False)
    if done.empty:
        return "No method finished every seed."
    text = f"Best with every seed finished: **{done.index[0]}** at {done.iloc[0]:.1f}%."
    if ours in done.index:
        rank = list(done.index).index(ours) + 1
        gap = done[ours] - done.drop(ours).max() if len(done) > 1 else float("nan")
        rival = done.drop(ours).idxmax() if len(done) > 1 else None
        text += (f" {ours} is {_ordinal(rank)} of {len(done)} at {done[ours]:.1f}%"
                 + (f", {gap:+.1f} points against {rival}" if rival else "") + ".")
        sem = table.loc[ours, "SEM"]
        if rival and np.isfinite(sem) and abs(gap) < 2 * max(sem, table.loc[rival, "SEM"]):
            text += " The gap is within two standard errors over seeds: not a separation."
    partial = table[table["status"] != "ok"]
    for m, row in partial.iterrows():
        text += f" {m}: {row['seeds']} of {row['of']} seeds finished ({row['status']}), drawn hatched."
    return text


def _ordinal(k: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(k, f"{k}th")


def plot_table1(table: pd.DataFrame, title: str):
    """Table 1 as bars: mean over seeds with its standard error; a method with a seed that did not finish
    grey and hatched, its label naming the seeds its bar averages."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from pflkit.report.figures import OKABE_ITO

    partial = (table["status"] != "ok").to_numpy()
    names = [f"{m}\n({row.seeds} of {row.of} seeds)" if bad else m
             for (m, row), bad in zip(table.iterrows(), partial)]
    fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(table), 3.8))
    x = np.arange(len(table))
    bars = ax.bar(x, table["ours (%)"], yerr=table["SEM"].fillna(0), capsize=3,
                  color=["#999999" if bad else OKABE_ITO[0] for bad in partial],
                  hatch=["//" if bad else "" for bad in partial], edgecolor="black", linewidth=0.5)
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in table["ours (%)"]], padding=3, fontsize=8)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("personalized test accuracy (%)")
    ax.set_ylim(0, 105)
    handles = [Patch(facecolor=OKABE_ITO[0], edgecolor="black", label="every seed finished"),
               Patch(facecolor="#999999", hatch="//", edgecolor="black",
                     label="a seed did not finish: mean of the others")]
    ax.legend(handles=handles, loc="upper left", fontsize=8, title="error bar: standard error over seeds",
              title_fontsize=8)
    ax.set_title(title)
    return fig
