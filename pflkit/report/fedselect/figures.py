"""FedSelect's Table 1, Fig. 1 and Fig. 2 (Tamirisa et al.) from saved or committed results, and the GradLTN
(Alg. 1) illustration: tables, figures and the sentences that read them.

Pure functions of a run's results (``results.json`` or its committed compact form, whose ``analysis`` holds
each FedSelect-style method's `pflkit.algorithms.fedselect.mask_report`: per client its personal share, and
the mean pairwise IoU of the client masks over the whole model) and of `grad_ltn`'s trace. Numbers in the
returned sentences come from the arguments only.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from pflkit.report.figures import OKABE_ITO, visible_spread

__all__ = ["personal_share", "mask_iou", "table1_frame", "table1_reading", "ltn_shares_reading",
           "plot_gradltn_schedule", "plot_layer_masks", "plot_accuracy_and_communication", "plot_accuracy_vs_p",
           "accuracy_vs_p_reading", "layer_mask_reading", "mask_frame", "plot_mask_overlap", "mask_reading",
           "SELECT_ROW", "HEAD_IOU", "HEAD_SHARE", "stored_head_iou", "plot_fig1"]

SELECT_ROW = re.compile(r"^FedSelect \((?P<p>[\d.]+)\)$")  # Alg. 1's rows, one per personalization rate p


def _seeds(results: dict, label: str) -> list[dict]:
    return ((results.get("analysis") or {}).get(label) or {}).get("seeds") or []


def personal_share(results: dict, label: str) -> list[float]:
    """Method ``label``'s personal share of each client (every seed), from the run's mask report; else the
    last logged round's ``client_personal_share`` (a run that predates the report). Empty when neither."""
    shares = [v for s in _seeds(results, label) for v in s.get("personal_share", []) if v is not None]
    if shares:
        return shares
    hist = next(iter((results.get("rounds") or {}).get(label, {}).values()), [])
    last = hist[-1].get("client_personal_share") if hist else None
    return [] if last is None else [last]


def mask_iou(results: dict, label: str) -> float | None:
    """Mean over seeds of the mean pairwise IoU of the clients' personal masks (whole model)."""
    vals = [s["mask_iou"] for s in _seeds(results, label) if s.get("mask_iou") is not None]
    return float(np.mean(vals)) if vals else None


def table1_frame(results: dict[int, dict], paper_header: str = "paper") -> pd.DataFrame:
    """Table 1, one row per method: per setting s our accuracy (%), the paper's, the personal share of the
    parameters (%, mean over clients) and the traffic (MiB per round, down + up, all clients)."""
    cols = {}
    for s, res in results.items():
        methods = res["methods"]
        cols[f"ours s={s}"] = {k: m["acc_mean"] if m.get("status") == "ok" else np.nan for k, m in methods.items()}
        cols[f"{paper_header} s={s}"] = {k: m.get("published") for k, m in methods.items()}
        cols[f"personal % s={s}"] = {k: 100 * np.mean(v) if (v := personal_share(res, k)) else np.nan
                                     for k in methods}
        cols[f"MiB/round s={s}"] = {k: m.get("bytes_per_round", np.nan) / 2 ** 20 for k, m in methods.items()}
    return pd.DataFrame(cols).astype(float).round(2)


def table1_reading(results: dict[int, dict], rivals=("FedAvg", "FedPer", "FedBABU", "LG-FedAvg")) -> str:
    """Per setting: the best method, and how many of the paper's FedSelect rows (Alg. 1) beat each rival."""
    parts = []
    for s, res in results.items():
        acc = {k: m["acc_mean"] for k, m in res["methods"].items() if m.get("status") == "ok"}
        rows = [k for k in acc if SELECT_ROW.match(k)]
        best = max(acc, key=acc.get)
        beats = [f"{r} in {sum(acc[k] > acc[r] for k in rows)} of {len(rows)}" for r in rivals if r in acc]
        parts.append(f"At s = {s} the best method is **{best}** ({acc[best]:.1f}%); the FedSelect rows "
                     f"({min(acc[k] for k in rows):.1f}-{max(acc[k] for k in rows):.1f}%) beat " + ", ".join(beats)
                     + ".")
    return " ".join(parts)


# ----------------------------------------------------------------------------- GradLTN (Alg. 1)

def layer_mask_reading(last: pd.Series) -> str:
    """The last GradLTN mask per tensor in words: how many tensors end wholly personal, wholly shared, split."""
    whole, none = list(last.index[last >= 1.0]), list(last.index[last <= 0.0])
    split = [k for k in last.index if k not in whole and k not in none]
    return (f"Of the {len(last)} tensors, {len(whole)} end wholly personal ({', '.join(whole) or 'none'}), "
            f"{len(none)} wholly shared ({', '.join(none) or 'none'}) and {len(split)} split between the two, "
            f"from {last[split].min():.2f} to {last[split].max():.2f} personal: the choice is made entry by entry."
            if split else f"Of the {len(last)} tensors, {len(whole)} end wholly personal and {len(none)} wholly "
            "shared.")


def ltn_shares_reading(shares, p: float) -> str:
    """How the candidate share of each GradLTN iteration compares with p^i."""
    gaps = [abs(v - p ** i) for i, v in enumerate(shares)]
    return (f"The candidate share goes {', '.join(f'{v:.3f}' for v in shares)} over iterations 0-{len(shares) - 1}: "
            f"its largest gap to $p^i$ ($p = {p:g}$) is {max(gaps):.1e}. After the last iteration "
            f"{100 * shares[-1]:.1f}% of the entries are personal, the rest shared.")


def plot_gradltn_schedule(shares, moved: np.ndarray, kept: np.ndarray, p: float, title: str):
    """Left: the candidate share per GradLTN iteration against p^i (log scale). Right: how far each entry moved
    in iteration 0, split by whether it stays a candidate (log-spaced bins)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    i = np.arange(len(shares))
    axes[0].bar(i, shares, color=OKABE_ITO[1], label="candidates (personal after the last)")
    axes[0].plot(i, p ** i, "k.--", label=f"$p^i$, $p = {p:g}$")
    axes[0].set_xticks(i)
    axes[0].set_xlabel("GradLTN iteration $i$")
    axes[0].set_ylabel("share of the model's entries")
    axes[0].set_yscale("log")
    axes[0].set_title("the candidate share falls as $p^i$")
    axes[0].legend()
    positive = moved[moved > 0]
    bins = np.logspace(np.log10(max(positive.min(), 1e-8)), np.log10(moved.max()), 40)
    axes[1].hist(moved[kept], bins=bins, color=OKABE_ITO[1], alpha=0.8, label="stay candidates")
    axes[1].hist(moved[~kept], bins=bins, color=OKABE_ITO[0], alpha=0.6, label="frozen (shared)")
    axes[1].set_xscale("log")
    axes[1].set_xlabel(r"$|\theta_1 - \theta_0|$ after iteration 0 (weight units)")
    axes[1].set_ylabel("entries (count)")
    axes[1].set_title("the entries that moved most stay candidates")
    axes[1].legend()
    fig.suptitle(title)
    return fig


def plot_layer_masks(per_layer: pd.DataFrame, title: str):
    """Heatmap of the candidate share of each tensor (rows) after each iteration (columns), values printed in
    a colour that contrasts with the cell."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7.5, 0.4 * len(per_layer) + 1.6))
    sns.heatmap(per_layer, annot=True, fmt=".2f", cmap="viridis", vmin=0, vmax=1, ax=ax,
                cbar_kws={"label": "share still a candidate"})
    ax.set_xlabel("mask after GradLTN iteration ($m_L$: personal)")
    ax.set_ylabel("parameter tensor")
    ax.set_title(title)
    return fig


# ----------------------------------------------------------------------------- Table 1 and Fig. 2

def plot_accuracy_and_communication(table: pd.DataFrame, settings, paper_header: str, title: str):
    """Left: our accuracy per method for each s (bars) with the paper's (markers). Right: MiB per round at
    the first setting (the traffic does not depend on s)."""
    import matplotlib.pyplot as plt

    order = table.index[::-1]
    y = np.arange(len(order))
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(table) + 1.8), sharey=True, layout="constrained")
    width = 0.8 / len(settings)
    markers = ("D", "^", "s")
    for k, s in enumerate(settings):
        off = (k - (len(settings) - 1) / 2) * width
        axes[0].barh(y - off, table.loc[order, f"ours s={s}"], height=width, color=OKABE_ITO[k],
                     label=f"pflkit, s = {s}")
        axes[0].scatter(table.loc[order, f"{paper_header} s={s}"], y - off, color="k", marker=markers[k], s=16,
                        zorder=3, label=f"{paper_header}, s = {s}")
    axes[1].barh(y, table.loc[order, f"MiB/round s={settings[0]}"], color="#999999")
    axes[0].set_yticks(y, order)
    axes[0].set_xlabel("test accuracy (%, mean over clients)")
    axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    axes[1].set_xlabel("traffic per round (MiB, down + up, all clients)")
    axes[0].set_title("accuracy")
    axes[1].set_title(f"communication (s = {settings[0]})")
    fig.suptitle(title)
    return fig


def _rates(res: dict, prefix: str) -> list[tuple[float, dict]]:
    rows = []
    for label, m in res["methods"].items():
        found = re.match(rf"^{re.escape(prefix)} \((?P<p>[\d.]+)\)$", label)
        if found:
            rows.append((float(found["p"]), m))
    return sorted(rows, key=lambda r: r[0])


def plot_accuracy_vs_p(results: dict[int, dict], paper_header: str, data_label: str, preset: str):
    """Fig. 2: accuracy against the personalization rate p, per setting s: Alg. 1 (``FedSelect (p)``), the
    authors' code schedule (``FedSelect/code (p)``) and the paper's numbers."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 3.8), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, (s, res) in zip(axes[0], results.items()):
        alg, code = _rates(res, "FedSelect"), _rates(res, "FedSelect/code")
        ps = [p for p, _ in alg]
        ax.plot(ps, [m["acc_mean"] for _, m in alg], "o-", color=OKABE_ITO[0], label=f"Alg. 1, pflkit ({preset})")
        if code:
            ax.plot([p for p, _ in code], [m["acc_mean"] for _, m in code], "s:", color=OKABE_ITO[1],
                    label=f"authors' code schedule, pflkit ({preset})")
        ax.plot(ps, [m.get("published") for _, m in alg], "k^--", label=paper_header)
        ax.set_xticks(ps)
        ax.set_xlabel("personalization rate $p$")
        ax.set_title(f"s = {s} classes per client")
    axes[0][0].set_ylabel("test accuracy (%, mean over clients)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    fig.suptitle(f"Fig. 2 on {data_label}: accuracy against $p$")
    return fig


def accuracy_vs_p_reading(results: dict[int, dict]) -> str:
    """Per setting: the span of Alg. 1's accuracy over p and which p is best, beside the paper's span."""
    parts = []
    for s, res in results.items():
        alg = _rates(res, "FedSelect")
        ours = {p: m["acc_mean"] for p, m in alg}
        paper = {p: m.get("published") for p, m in alg if m.get("published") is not None}
        best = max(ours, key=ours.get)
        text = (f"s = {s}: ours spans {max(ours.values()) - min(ours.values()):.1f} points over $p$, "
                f"best at $p = {best:g}$")
        if paper:
            pbest = max(paper, key=paper.get)
            text += (f" (paper: {max(paper.values()) - min(paper.values()):.1f} points, best at $p = {pbest:g}$)")
        parts.append(text + ".")
    return " ".join(parts)


# ----------------------------------------------------------------------------- masks (Fig. 1)

def mask_frame(results: dict[int, dict]) -> pd.DataFrame:
    """Per method with a mask report: for each s the personal share (%, mean over clients and seeds) and the
    mean pairwise IoU of the client masks over the whole model."""
    rows = {}
    for s, res in results.items():
        for label in res["methods"]:
            iou = mask_iou(res, label)
            if iou is None:
                continue
            rows.setdefault(label, {})[f"personal % s={s}"] = 100 * float(np.mean(personal_share(res, label)))
            rows[label][f"mask IoU s={s}"] = iou
    return pd.DataFrame.from_dict(rows, orient="index").round(3)


def plot_mask_overlap(frame: pd.DataFrame, settings, title: str):
    """Per method: the personal share of its parameters (left) and how much the clients' masks overlap
    (right, mean pairwise IoU: 1 = every client personalizes the same entries), one bar per s."""
    import matplotlib.pyplot as plt

    y = np.arange(len(frame))[::-1]
    width = 0.8 / len(settings)
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(frame) + 1.8), sharey=True, layout="constrained")
    for k, s in enumerate(settings):
        off = (k - (len(settings) - 1) / 2) * width
        for ax, col in zip(axes, (f"personal % s={s}", f"mask IoU s={s}")):
            bars = ax.barh(y - off, frame[col], height=width, color=OKABE_ITO[k], label=f"s = {s}")
            ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=7)
    axes[0].set_yticks(y, frame.index)
    axes[0].set_xlabel("personal entries (% of the model, mean over clients)")
    axes[1].set_xlabel("mean IoU of two clients' personal masks")
    axes[1].set_xlim(0, 1.1)
    axes[0].set_title("how much each client keeps")
    axes[1].set_title("how much the clients' choices overlap")
    axes[1].legend(loc="lower right")
    fig.suptitle(title)
    return fig


def mask_reading(results: dict[int, dict]) -> str:
    """The masks in words: the IoU range of the paper's FedSelect rows per s against the layer-wise methods',
    and the personal share, stated as one value per row when it does not vary across clients."""
    parts, flat = [], {}
    for s, res in results.items():
        rows = [k for k in res["methods"] if SELECT_ROW.match(k) and mask_iou(res, k) is not None]
        if not rows:
            continue
        ious = [mask_iou(res, k) for k in rows]
        others = [v for k in res["methods"] if not k.startswith("FedSelect") and (v := mask_iou(res, k)) is not None]
        parts.append(f"At s = {s} the FedSelect rows' client masks overlap with a mean IoU of "
                     f"{min(ious):.2f}-{max(ious):.2f}" + (f", the other masked methods' {min(others):.2f}-"
                                                          f"{max(others):.2f}" if others else "") + ".")
        for k in rows:
            shares = personal_share(res, k)
            if shares and not visible_spread(shares, span=1.0):
                flat.setdefault(k, []).extend(shares)
    if flat:
        parts.append("The personal share is the same on every client (so it is not plotted per client): "
                     + "; ".join(f"{k}: {100 * np.mean(v):.3g}% (spread {np.ptp(v):.2g})" for k, v in flat.items())
                     + ". GradLTN keeps a fixed share; the clients differ in *which* entries, not how many.")
    return " ".join(parts) or "No run here recorded the clients' masks."


# what a mask report would store for Fig. 1 to be drawn from a compact result: the (n, n) pairwise IoU of the
# clients' final-linear-layer masks, and each client's personal share of that layer
HEAD_IOU, HEAD_SHARE = "head_mask_iou", "head_personal_share"


def stored_head_iou(results: dict, label: str = "FedSelect (0.50)", seed: int | None = None):
    """Fig. 1's matrix and the mean head personal share (None where not stored) from the run's mask report,
    when the run stored the matrix (``HEAD_IOU``); else ``(None, None)``."""
    for s in _seeds(results, label):
        if (seed is None or s.get("seed") == seed) and s.get(HEAD_IOU) is not None:
            share = s.get(HEAD_SHARE)
            return np.asarray(s[HEAD_IOU], dtype=float), (float(np.mean(share)) if share else None)
    return None, None


def plot_fig1(ious: dict, shares: dict, title: str):
    """Fig. 1: per setting s the (n, n) IoU of every pair of client masks in the final linear layer, values
    printed in a colour that contrasts with the cell; ``shares[s]`` (the mean personal share of the head, a
    fraction, or None) goes into the panel's title."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, len(ious), figsize=(5.5 * len(ious) + 1, 5.2), squeeze=False, layout="constrained")
    for ax, (s, iou) in zip(axes[0], ious.items()):
        sns.heatmap(iou, vmin=0, vmax=1, cmap="viridis", annot=len(iou) <= 10, fmt=".2f", ax=ax, square=True,
                    annot_kws={"size": 7}, cbar=False)
        share = shares.get(s)
        note = "" if share is None else f"\n({share:.1%} of head entries personal, mean over clients)"
        ax.set_title(f"s = {s}: IoU of the head masks" + note)
        ax.set_xlabel("client (index)")
        ax.set_ylabel("client (index)")
    fig.colorbar(plt.cm.ScalarMappable(norm=plt.Normalize(0, 1), cmap="viridis"), ax=axes[0].tolist(), shrink=0.8,
                 label="IoU of two clients' personal masks")
    fig.suptitle(title)
    return fig
