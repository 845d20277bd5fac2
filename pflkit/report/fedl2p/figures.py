"""FedL2P's figures and tables from saved runs (Fig. 2 / 4, Table 6, Fig. 3 / 5, Tables 1-5).

Pure functions of the files `pflkit.run.runner` writes: ``results.json``, and per seed
``seed{S}/federation.npz`` (each client's metadata: domain, corruption, speaker, pool) and
``seed{S}/<method slug>.report.json`` (`pflkit.algorithms.fedl2p.hyperparameter_report`:
per client beta per BN layer, eta per parameter tensor, sparsity, xi, features).

* `hyperparameter_frame` / `plot_hyperparameters`: the locality, spread and skewness of the
  learned beta (per BN layer) and eta (per tensor) across clients, and each client's
  sparsity (Fig. 2 / 4);
* `ari_table`: Table 6 for one run (ARI of xi, beta, features, eta clusterings vs domains),
  beside the paper's numbers, each ARI with the between- and within-domain spread of the
  clustered quantity (the ARI is scale-free, `pflkit.analysis.clustering`);
  `plot_distance_map`: Fig. 3 / 5;
* `plot_hyperparameters_by_domain`: beta per BN layer and eta per tensor (relative to its
  across-client median) with one box per domain, the spreads in the panel titles;
* `versus_finetuning`: FedL2P against the best of the FT (BN C / G / I) baselines.

These need a run folder (a fresh run); `pflkit.report.fedl2p.learned` draws what the committed compact
results store.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pflkit.analysis.clustering import (
    META_NET_KEYS, domain_distance_map, group_spread, meta_net_clustering, report_matrix,
)
from pflkit.io import read_json, slug

__all__ = ["ARI_KEYS", "published_ari", "FT_LABELS", "report_path", "load_report", "client_info", "client_groups",
           "hyperparameter_frame", "beta_summary", "plot_hyperparameters", "ari_table",
           "plot_distance_map", "versus_finetuning", "plot_hyperparameters_by_domain", "spread_caption"]

# Table 6's columns, as an experiment file's [published_detail.ari] names them, in the order of
# `pflkit.analysis.clustering.META_NET_KEYS` (BNNet input xi, BNNet output beta, LRNet input x, LRNet output eta)
ARI_KEYS = ("bnnet_input", "beta", "lrnet_input", "eta")


def published_ari(detail: dict) -> tuple | None:
    """Table 6's four ARIs from an experiment's ``published_detail`` (None when the file has none)."""
    ari = (detail or {}).get("ari")
    return None if ari is None else tuple(ari.get(k) for k in ARI_KEYS)


FT_LABELS = ("FT (BN C)", "FT (BN G)", "FT (BN I)")


def report_path(run_dir, label: str = "FedL2P", seed: int = 0) -> Path:
    """``run_dir/seed{seed}/<slug(label)>.report.json`` (the runner's naming)."""
    return Path(run_dir) / f"seed{seed}" / f"{slug(label)}.report.json"


def load_report(run_dir, label: str = "FedL2P", seed: int = 0) -> list[dict]:
    """The hyperparameter report of one method and seed of a run (one dict per client)."""
    path = report_path(run_dir, label, seed)
    if not path.exists():
        raise FileNotFoundError(f"no hyperparameter report at {path}: was {label!r} run (and did it finish)?")
    return read_json(path)


def client_info(run_dir, seed: int = 0) -> list[dict]:
    """Each client's metadata as the run saved it (``federation.npz``): domain, pool, num_train, ..."""
    path = Path(run_dir) / f"seed{seed}" / "federation.npz"
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["__info__"]))


def client_groups(run_dir, key: str, seed: int = 0) -> np.ndarray:
    """The value of metadata ``key`` (``"domain"``, ``"corruption"``, ``"speaker"``) of every client."""
    info = client_info(run_dir, seed)
    if not all(key in c for c in info):
        raise KeyError(f"the clients of {run_dir} carry no {key!r}; they have {sorted(info[0])}")
    return np.array([c[key] for c in info])


def hyperparameter_frame(rows: list[dict], kind: str) -> pd.DataFrame:
    """Long table of one hyperparameter: columns ``client``, ``name`` (layer / tensor), ``value``.

    ``kind`` is ``"beta"`` (one row per client and BN layer) or ``"eta"`` (per client and tensor).
    """
    if kind not in ("beta", "eta"):
        raise ValueError(f"kind must be 'beta' or 'eta', got {kind!r}")
    return pd.DataFrame([{"client": r["client"], "name": name, "value": float(v)}
                         for r in rows for name, v in r[kind].items()], columns=["client", "name", "value"])


def beta_summary(rows: list[dict]) -> dict:
    """Mean / min / max of beta over clients and BN layers, the per-layer means and the mean sparsity."""
    b = report_matrix(rows, "beta")
    names = list(rows[0]["beta"])
    return {"mean": float(b.mean()), "min": float(b.min()), "max": float(b.max()),
            "per_layer": dict(zip(names, b.mean(axis=0).round(4).tolist())),
            "sparsity": float(report_matrix(rows, "sparsity").mean())}


def _boxes(ax, frame: pd.DataFrame, ylabel: str):
    """One box per layer / tensor over clients; where no name's values spread visibly (1% of the axis), the
    per-name mean as a bar instead of boxes collapsed to lines, and the title says so."""
    from pflkit.report.figures import OKABE_ITO, visible_spread

    names = list(dict.fromkeys(frame["name"]))
    data = [frame.loc[frame["name"] == n, "value"].to_numpy() for n in names]
    ticks = [n.replace(".weight", ".w").replace(".bias", ".b") for n in names]
    span = max(float(frame["value"].abs().max()), 1e-12)
    if any(visible_spread(d, span=span) for d in data):
        ax.boxplot(data, tick_labels=ticks, showmeans=True, medianprops={"color": OKABE_ITO[3]},
                   meanprops={"marker": "D", "markerfacecolor": "black", "markeredgecolor": "black", "markersize": 4})
        ax.plot([], [], color=OKABE_ITO[3], label="median over clients")
        ax.plot([], [], "D", color="black", markersize=4, label="mean over clients")
        ax.legend(fontsize=8)
    else:
        ax.bar(range(1, len(names) + 1), [d.mean() for d in data], color=OKABE_ITO[0])
        ax.set_xticks(range(1, len(names) + 1), ticks)
        ax.set_title("the same for every client (spread < 1% of the axis)", fontsize=9)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", rotation=90, labelsize=8)


def plot_hyperparameters(rows: list[dict], title: str = "", axes=None):
    """Fig. 2 for one scenario from a full report (a fresh run): beta per BN layer and eta per tensor over
    clients; the sparsity per client drawn when it varies, else stated."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import constant_statement, text_panel, visible_spread

    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(15, 4.2), gridspec_kw={"width_ratios": [2, 4, 1.4], "wspace": 0.3})
    beta = hyperparameter_frame(rows, "beta")
    if len(beta):
        _boxes(axes[0], beta, "β (0 = pretrained BN stats)")
        axes[0].set_ylim(-0.05, 1.05)
    else:
        text_panel(axes[0], "no BN layers")
    _boxes(axes[1], hyperparameter_frame(rows, "eta"), "η (learning rate)")
    axes[1].axhline(0, color="k", lw=0.5)
    sparsity = report_matrix(rows, "sparsity")[:, 0]
    if visible_spread(sparsity, span=1.0):
        axes[2].boxplot([sparsity], tick_labels=["clients"], showmeans=True)
        axes[2].set_ylabel("sparsity (share with η = 0)")
        axes[2].set_ylim(-0.05, 1.05)
    else:
        text_panel(axes[2], constant_statement("sparsity", sparsity, digits=3).replace(" for", "\nfor"))
    axes[0].figure.suptitle(title, y=1.03)
    return axes[0].figure


def ari_table(rows: list[dict], domains, published: tuple | None = None, seed: int = 0) -> pd.DataFrame:
    """Table 6 for one run: one row per meta-net input / output with our ARI and the paper's.

    Beside each ARI, the spread of the clustered quantity across clients
    (`pflkit.analysis.clustering.group_spread`): ``between`` / ``within`` (standard
    deviations between the domain means and inside the domains, RMS over coordinates),
    ``between / level`` and ``within / level`` (the same relative to the coordinates'
    size), and ``near-constant``: True when the between-domain spread is below 0.1% of the
    level, where an output ARI only echoes the inputs' clusters through an almost constant map.
    """
    ours = meta_net_clustering(rows, domains, seed=seed)
    out = []
    for k, key in enumerate(META_NET_KEYS):
        net, role = META_NET_KEYS[key]
        c = ours[key]
        out.append({"meta-net": net, "role": role, "quantity": key, "ARI": round(c["ari"], 3),
                    "paper": None if published is None else published[k],
                    "between": float(f"{c['between']:.3g}"), "within": float(f"{c['within']:.3g}"),
                    "between / level": float(f"{c['between_rel']:.3g}"),
                    "within / level": float(f"{c['within_rel']:.3g}"), "near-constant": c["near_constant"]})
    return pd.DataFrame(out)


def plot_distance_map(rows: list[dict], domains, key: str, names=None, ax=None, title: str | None = None):
    """Fig. 3 / 5: the normalized log distance map of one report field between domains."""
    import matplotlib.pyplot as plt

    ids, m = domain_distance_map(report_matrix(rows, key), domains)
    labels = [str(i) if names is None else str(names[int(i)]) for i in ids]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 + 0.9 * len(ids), 1 + 0.8 * len(ids)))
    lim = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
    im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim)
    for (j, k), v in np.ndenumerate(m):  # white on the dark ends of the map, black on the light middle
        dark = np.isfinite(v) and abs(v) > 0.55 * lim
        ax.text(k, j, "nan" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8,
                color="white" if dark else "black")
    ax.set_xticks(range(len(ids)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(ids)), labels)
    ax.set_title(title or f"log normalized distance of {key}")
    ax.set_xlabel("domain")
    ax.set_ylabel("domain")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, label="log normalized distance")
    return ax


def spread_caption(values, domains) -> str:
    """One line: between- and within-domain spread of per-client values (`group_spread`)."""
    sp = group_spread(values, domains)

    def pct(v):
        return f" ({100 * v:.2g}% of level)" if np.isfinite(v) else ""

    return f"between-domain SD {sp['between']:.3g}{pct(sp['between_rel'])}, within {sp['within']:.3g}{pct(sp['within_rel'])}"


def plot_hyperparameters_by_domain(rows: list[dict], domains, names=None, title: str = "", axes=None):
    """Fig. 2 split by domain: do beta and eta differ between clients, and along the domains?

    Left: beta per BN layer, one box per domain (clients of that domain). Right: each client's
    eta of each tensor divided by that tensor's median over clients, one box per domain and
    tensor (1 = the typical client; a flat line at 1 = eta does not depend on the client).
    Each panel's title gives the spread across clients (`spread_caption`).

    Args:
        rows: a FedL2P hyperparameter report (one dict per client).
        domains: the domain of each row's client.
        names: optional domain names, indexed by the domain ids.
    """
    import matplotlib.pyplot as plt

    g = np.asarray(domains)
    ids = list(np.unique(g))
    labels = [str(i) if names is None else str(names[int(i)]) for i in ids]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(15, 4), gridspec_kw={"width_ratios": [1.6, 3], "wspace": 0.25})
    from pflkit.report.figures import OKABE_ITO as colors

    def grouped(ax, m, tick_names):
        width = 0.8 / len(ids)
        for j, d in enumerate(ids):
            pos = np.arange(m.shape[1]) + (j - (len(ids) - 1) / 2) * width
            bp = ax.boxplot([m[g == d, k] for k in range(m.shape[1])], positions=pos, widths=width * 0.9,
                            patch_artist=True, showfliers=False, manage_ticks=False,
                            # a zero-height box is only its median line: draw it in the domain's colour
                            medianprops={"color": colors[j % len(colors)], "lw": 2})
            for box in bp["boxes"]:
                box.set(facecolor=colors[j % len(colors)], alpha=0.6)
            ax.plot([], [], color=colors[j % len(colors)], lw=6, alpha=0.6, label=labels[j])
        ax.set_xticks(range(m.shape[1]), [n.replace(".weight", ".w").replace(".bias", ".b") for n in tick_names],
                      rotation=90, fontsize=8)

    from pflkit.report.figures import text_panel, visible_spread

    def stated(ax, what, m):
        # no visible spread on the axis: each domain's mean, in words, instead of boxes collapsed to lines
        import textwrap

        if not np.nan_to_num(m).any():  # an all-zero panel is that sentence
            text_panel(ax, textwrap.fill(f"{what} = 0 for every client and domain: every client keeps the "
                                         "pretrained statistics.", 44))
            return
        means = ", ".join(f"{lab} {np.nanmean(m[g == d]):.4g}" for d, lab in zip(ids, labels))
        text_panel(ax, textwrap.fill(f"{what} has no visible spread across clients (below 1% of the axis), so no "
                                     f"boxes are drawn. Mean by domain: {means}", 44))

    beta = report_matrix(rows, "beta")
    if beta.size and beta.shape[1]:
        if visible_spread(beta.ravel() - np.repeat(beta.mean(axis=0, keepdims=True), len(beta), 0).ravel(), span=1.0):
            grouped(axes[0], beta, list(rows[0]["beta"]))
            axes[0].set_ylabel("beta (0: pretrained BN stats, 1: client's)")
            axes[0].set_ylim(-0.05, 1.05)  # the full range: a spread of 1e-5 must look flat
            axes[0].legend(title="domain", fontsize=8)
        else:
            stated(axes[0], "β of each BN layer", beta)
        axes[0].set_title("beta: " + spread_caption(beta, g), fontsize=9)
    else:
        text_panel(axes[0], "no BN layers")
    eta = report_matrix(rows, "eta")
    med = np.median(eta, axis=0)
    rel = np.divide(eta, med, out=np.full_like(eta, np.nan), where=med != 0)
    finite = rel[np.isfinite(rel)]
    # a learning rate within 1% of the typical client's is the same learning rate: stated, not drawn
    if visible_spread(finite, span=1.0):
        grouped(axes[1], rel, list(rows[0]["eta"]))
        axes[1].axhline(1.0, color="k", lw=0.5)
        lo, hi = float(finite.min()), float(finite.max())
        pad = 0.05 * max(hi - lo, 0.1)
        axes[1].set_ylim(min(lo - pad, 0.95), max(hi + pad, 1.05))
        axes[1].set_ylabel("eta / its median over clients")
        axes[1].legend(title="domain", fontsize=8)
    else:
        text_panel(axes[1], "η / its median over clients stays within "
                            f"{100 * float(np.max(np.abs(finite - 1))) if finite.size else 0:.2g}% of 1 for every client "
                            "and tensor (under 1%, so no boxes are drawn):\nLRNet gives every client the same "
                            "learning rates, whatever its domain.")
    axes[1].set_title("eta: " + spread_caption(eta, g), fontsize=9)
    axes[0].figure.suptitle(title, y=1.03)
    return axes[0].figure


def versus_finetuning(results: dict, label: str = "FedL2P", ft_labels=FT_LABELS, pool: str = "seen") -> dict:
    """FedL2P against the best FT baseline of a ``results.json`` (``pool="unseen"``: the unseen clients).

    Returns ``{"fedl2p", "best_ft", "best_ft_label", "gain"}`` (percentages; None where missing).
    """
    methods = results["methods"]

    def acc(name):
        m = methods.get(name)
        if m is None or m.get("status") != "ok":
            return None
        return m["acc_mean"] if pool == "seen" else (m.get("unseen") or {}).get("acc_mean")

    fts = {name: acc(name) for name in ft_labels if acc(name) is not None}
    best = max(fts, key=fts.get) if fts else None
    ours = acc(label)
    return {"fedl2p": ours, "best_ft_label": best, "best_ft": fts.get(best),
            "gain": None if ours is None or best is None else ours - fts[best]}

