"""FedL2P's learned hyperparameters from the compact result (what a notebook shows without training).

The batch stores per method and seed (`pflkit.report.compact`): each client's mean beta over its BN layers,
each client's sparsity (share of parameters with eta = 0), each BN layer's mean beta over clients, the
clients' domains and Table 6's ARIs. These functions draw and read only that: Fig. 2's beta and sparsity as
far as they go (`plot_learned`), beta by domain (`plot_beta_by_domain`), sparsity across scenarios
(`plot_sparsity_scenarios`), Table 6 (`ari_frame`), and generated sentences. A per-client quantity whose
spread is below 1% of its [0, 1] axis is stated, not drawn (`learned_statements`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pflkit.analysis.clustering import META_NET_KEYS

__all__ = ["learned", "meta_rounds", "domain_label", "learned_statements", "plot_learned", "learned_reading",
           "plot_beta_by_domain", "plot_sparsity_scenarios", "drawable", "ari_frame", "PUBLISHED_ON", "paper_label"]


def learned(results: dict, label: str = "FedL2P", seed: int = 0, run_dir=None) -> dict | None:
    """The compact hyperparameter summary of ``label``'s seed ``seed``: ``beta_per_client``,
    ``sparsity_per_client``, ``beta_per_layer`` (and ``domains``, ``ari`` where the clients have domains).

    Read from ``results["analysis"]`` (a committed result), else computed from the run folder ``run_dir``
    (a fresh run, `pflkit.report.compact.analysis`). None when the method stored no report.
    """
    an = results.get("analysis")
    if not an and run_dir is not None:
        from pflkit.report.compact import analysis

        an = analysis(Path(run_dir), results)
    seeds = ((an or {}).get(label) or {}).get("seeds") or []
    return next((s for s in seeds if s.get("seed") == seed), None)


def domain_label(ids, names=None) -> list[str]:
    """Display names of domain ids (the ids themselves when the dataset names none)."""
    return [str(i) if names is None else str(names[int(i)]) for i in ids]


def _finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def learned_statements(summary: dict, names=None) -> list[str]:
    """Sentences for the per-client quantities too flat to draw (`pflkit.report.figures.visible_spread` on the
    [0, 1] axis they live on): beta per client (per domain where there are domains) and sparsity."""
    from pflkit.report.figures import constant_statement, visible_spread

    out = []
    beta = _finite(summary.get("beta_per_client") or [])
    if beta.size and not visible_spread(beta, span=1.0):
        text = constant_statement("mean β over BN layers", beta)
        doms = summary.get("domains")
        if doms is not None and len(doms) == len(beta):
            g = np.asarray(doms)
            parts = [f"{n} {beta[g == d].mean():.4f}" for d, n in zip(np.unique(g), domain_label(np.unique(g), names))]
            text += "; by domain: " + ", ".join(parts)
        out.append(text)
    sparsity = _finite(summary.get("sparsity_per_client") or [])
    if sparsity.size and not visible_spread(sparsity, span=1.0):
        out.append(constant_statement("sparsity", sparsity, digits=3)
                   + (": no tensor frozen (η > 0 everywhere)" if not sparsity.any() else ""))
    return out


def _client_axis(ax, n: int) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_xlabel("client (index)")


def _per_client(ax, values, domains, names, ylabel: str) -> None:
    from pflkit.report.figures import OKABE_ITO

    v = np.asarray(values, dtype=float)
    g = np.zeros(len(v), dtype=int) if domains is None else np.asarray(domains)
    for j, d in enumerate(np.unique(g)):
        idx = np.flatnonzero(g == d)
        ax.plot(idx, v[idx], "o", color=OKABE_ITO[j % len(OKABE_ITO)],
                label=None if domains is None else domain_label([d], names)[0])
    _client_axis(ax, len(v))
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel(ylabel)
    if domains is not None:
        ax.legend(title="domain", fontsize=8)


def plot_learned(summary: dict, title: str, names=None):
    """What FedL2P learned, from the compact summary (Fig. 2 as far as it goes): the mean β of each BN layer
    over clients (bars, Eq. 2), and each client's mean β and sparsity where they vary visibly; what does
    not vary is stated in a text panel instead of drawn (`learned_statements`)."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO, text_panel, visible_spread

    beta, sparsity = (_finite(summary.get(k) or []) for k in ("beta_per_client", "sparsity_per_client"))
    draw_beta, draw_sparsity = visible_spread(beta, span=1.0), visible_spread(sparsity, span=1.0)
    statements = learned_statements(summary, names)
    panels = 1 + draw_beta + draw_sparsity + bool(statements)
    widths = [1.0] + [2.0] * (draw_beta + draw_sparsity) + ([1.6] if statements else [])
    fig, axes = plt.subplots(1, panels, figsize=(3.4 * sum(widths) + 0.5, 3.6), squeeze=False,
                             gridspec_kw={"width_ratios": widths, "wspace": 0.35})
    axes = list(axes[0])
    layers = summary.get("beta_per_layer") or {}
    ax = axes.pop(0)
    if layers:
        bars = ax.bar(range(len(layers)), list(layers.values()), color=OKABE_ITO[0])
        ax.bar_label(bars, labels=[f"{v:.3f}" for v in layers.values()], padding=2, fontsize=9)
        ax.set_xticks(range(len(layers)), list(layers), rotation=30, ha="right")
        ax.set_xlabel("BN layer")
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("β, mean over clients (0 = pretrained stats)")
        ax.set_title("β per BN layer (Eq. 2)")
    else:
        text_panel(ax, "no BN layers: β does not apply")
    doms = summary.get("domains")
    if draw_beta:
        ax = axes.pop(0)
        _per_client(ax, beta, doms if doms is not None and len(doms) == len(beta) else None, names,
                    "client's mean β over BN layers")
        ax.set_title("β per client")
    if draw_sparsity:
        ax = axes.pop(0)
        _per_client(ax, sparsity, doms if doms is not None and len(doms) == len(sparsity) else None, names,
                    "sparsity (share of parameters with η = 0)")
        ax.set_title("sparsity per client")
    if statements:
        ax = axes.pop(0)
        import textwrap

        text_panel(ax, "Not drawn (no visible spread across clients):\n\n"
                   + "\n\n".join(textwrap.fill(t, 46) for t in statements))
        ax.texts[0].set_fontsize(9)
    fig.suptitle(title, y=1.04)
    return fig


def meta_rounds(results: dict, label: str = "FedL2P") -> int | None:
    """The number of meta-learning rounds ``label`` ran with in this result's config."""
    return next((m.get("rounds") for m in results["config"].get("methods", []) if m.get("label") == label), None)


def learned_reading(summary: dict | None, label: str = "FedL2P", names=None) -> str:
    """Markdown: the mean β of each BN layer, where the per-client values sit and the sparsity."""
    if not summary:
        return f"{label} stored no hyperparameter summary in this result."
    layers = summary.get("beta_per_layer") or {}
    text = (f"{label}'s mean β per BN layer: " + ", ".join(f"{k} **{v:.3f}**" for k, v in layers.items()) + ". "
            if layers else f"{label}'s model has no BN layer. ")
    beta = _finite(summary.get("beta_per_client") or [])
    if beta.size and not beta.any() and not any((summary.get("beta_per_layer") or {}).values()):
        sparsity = _finite(summary.get("sparsity_per_client") or [])
        return (f"{label}'s β = 0 in every BN layer for all {beta.size} clients: every client keeps the pretrained "
                "statistics, as FT (BN G) does. "
                + (f"Sparsity: {learned_statements({'sparsity_per_client': sparsity.tolist()})[0]}."
                   if sparsity.size and learned_statements({"sparsity_per_client": sparsity.tolist()}) else ""))
    if beta.size:
        side = "the pretrained statistics (β = 0)" if beta.mean() < 0.5 else "the client's own statistics (β = 1)"
        text += (f"Over the {beta.size} clients the mean β runs from {beta.min():.4f} to {beta.max():.4f}: closer to "
                 f"{side}. ")
    statements = learned_statements(summary, names)
    if statements:
        text += "Too flat to draw: " + "; ".join(statements) + "."
    return text


def plot_beta_by_domain(summary: dict, names=None, title: str = "", ax=None):
    """Each client's mean β grouped by domain (a dot per client), or, when the clients' values do not
    spread visibly on [0, 1], a text panel that states each domain's value and the spread."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO, text_panel, visible_spread

    beta = np.asarray(summary["beta_per_client"], dtype=float)
    g = np.asarray(summary["domains"])
    ids = np.unique(g)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    if not visible_spread(beta, span=1.0):
        text_panel(ax, "\n".join(learned_statements({"beta_per_client": beta.tolist(), "domains": g.tolist()}, names)[0].split("; "))
                   + f"\n\nSpread over all clients: {beta.max() - beta.min():.2g} on a [0, 1] scale,\n"
                   "below what an axis can show, so no dots are drawn.")
    else:
        rng = np.random.default_rng(0)
        for j, d in enumerate(ids):
            v = beta[g == d]
            ax.plot(j + rng.uniform(-0.15, 0.15, v.size), v, "o", color=OKABE_ITO[j % len(OKABE_ITO)], alpha=0.8,
                    label=f"{domain_label([d], names)[0]} ({v.size} clients)")
            ax.hlines(v.mean(), j - 0.3, j + 0.3, color="black", lw=1.5)
        ax.plot([], [], color="black", lw=1.5, label="domain mean")
        ax.set_xticks(range(len(ids)), domain_label(ids, names))
        ax.set_xlabel("domain")
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("client's mean β over BN layers")
        ax.legend(fontsize=8)
    ax.set_title(title)
    return ax


def plot_sparsity_scenarios(scenarios: dict[str, dict], title: str = "", kinds: dict[str, str] | None = None, ax=None):
    """The bottom panel of Fig. 2 from compact summaries: each scenario's mean sparsity over clients (bar,
    value printed, coloured by its kind, e.g. label shift / domains) with its client range (whiskers); one
    sentence instead when every value is 0. The y-axis spans the largest value, so small ones stay visible."""
    import matplotlib.pyplot as plt

    from pflkit.report.figures import OKABE_ITO, text_panel

    names = list(scenarios)
    vals = [_finite(s.get("sparsity_per_client") or []) for s in scenarios.values()]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 0.55 * len(names), 4.0))
    if not any(v.size and v.any() for v in vals):
        text_panel(ax, f"sparsity = 0 for every client of all {len(names)} scenarios: FedL2P froze no tensor")
        ax.set_title(title)
        return ax
    mean = np.array([v.mean() if v.size else np.nan for v in vals])
    # clipped at 0: a mean of equal values can exceed their min by a rounding error
    lo = np.clip(mean - np.array([v.min() if v.size else np.nan for v in vals]), 0, None)
    hi = np.clip(np.array([v.max() if v.size else np.nan for v in vals]) - mean, 0, None)
    kinds = kinds or {}
    order = list(dict.fromkeys(kinds.get(n, "") for n in names))
    colors = [OKABE_ITO[order.index(kinds.get(n, "")) % len(OKABE_ITO)] for n in names]
    bars = ax.bar(range(len(names)), mean, yerr=[lo, hi], color=colors, capsize=3)
    ax.bar_label(bars, labels=[f"{v:.3f}" for v in mean], padding=2, fontsize=8)
    for k, kind in enumerate(order):
        if kind:
            ax.bar([0], [0], color=OKABE_ITO[k % len(OKABE_ITO)], label=kind)
    ax.plot([], [], color="black", label="whiskers: min to max over clients")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_ylim(0, max(0.05, 1.3 * float(np.nanmax(mean + hi))))
    ax.set_xlabel("scenario (committed FedL2P row)")
    ax.set_ylabel("sparsity, mean over clients\n(share of parameters with η = 0)")
    ax.legend(loc="upper left", fontsize=8)
    zero = int(np.sum(mean == 0))
    ax.set_title(title + (f"\n{zero} of {len(names)} scenarios at exactly 0" if zero else ""))
    return ax


def drawable(summary: dict | None) -> bool:
    """Whether `plot_learned` has anything to draw: a BN layer with mean β above 0, or a per-client β or
    sparsity that varies visibly. Otherwise `learned_reading` says it all."""
    from pflkit.report.figures import visible_spread

    if not summary:
        return False
    return (any(v for v in (summary.get("beta_per_layer") or {}).values())
            or visible_spread(_finite(summary.get("beta_per_client") or []), span=1.0)
            or visible_spread(_finite(summary.get("sparsity_per_client") or []), span=1.0))


def ari_frame(summary: dict, published: tuple | None = None) -> pd.DataFrame:
    """Table 6 from the compact summary: the stored ARI of each meta-net input / output against the domains,
    beside the paper's (the spreads of `ari_table` need the full report: a fresh run)."""
    stored = summary.get("ari") or {}
    rows = []
    for k, key in enumerate(META_NET_KEYS):
        net, role = META_NET_KEYS[key]
        ari = stored.get(key)
        rows.append({"meta-net": net, "role": role, "quantity": key,
                     "ARI": None if ari is None else round(float(ari), 3),
                     "paper": None if published is None else published[k]})
    return pd.DataFrame(rows).set_index("quantity")


# The dataset the paper's numbers of an offline stand-in row come from (each experiment file's header says so):
# pflkit's digit domains play DomainNet / Office-Caltech-10 (the files quote DomainNet's rows), FSDD plays
# Speech Commands.
PUBLISHED_ON = {"digit_domains": "DomainNet", "fsdd": "Speech Commands"}


def paper_label(results: dict, default: str = "paper") -> str:
    """The legend / column name of the paper's numbers: ``paper (on DomainNet)`` where the experiment plots
    another dataset than the one the published numbers were measured on, else ``default``."""
    other = PUBLISHED_ON.get(results["config"]["data"]["dataset"])
    return f"paper (on {other})" if other else default


def client_report(results: dict, label: str = "FedL2P", seed: int = 0, run_dir=None):
    """``(rows, domains)``: FedL2P's per-client report in `hyperparameter_report`'s form and every client's
    domain, read from the run folder when one is given (train mode), else from the arrays a compact result
    stores (`pflkit.report.compact.report_rows`); ``(None, None)`` when neither holds them."""
    from pflkit.report.compact import report_rows
    from pflkit.report.fedl2p.figures import client_groups, load_report

    if run_dir is not None and Path(run_dir, f"seed{seed}").is_dir():
        return load_report(run_dir, label, seed), client_groups(run_dir, "domain", seed)
    seeds = ((results.get("analysis") or {}).get(label) or {}).get("seeds") or []
    summary = next((s for s in seeds if s.get("seed") == seed), None)
    rows = report_rows(summary) if summary else None
    if rows is None or summary.get("domains") is None:
        return None, None
    return rows, np.asarray(summary["domains"])
