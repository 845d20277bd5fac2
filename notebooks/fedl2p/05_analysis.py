# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # FedL2P Table 6 and Figs. 2-5 (Lee et al., NeurIPS 2023): do the meta-nets know the clients' domains?
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/05_analysis.ipynb)
#
# **What you will learn**
# - how to test whether a meta-net's input or output "knows" the clients' domains: cluster the clients by it
#   and score the clusters against the true domains with the adjusted Rand index (Table 6);
# - how to read a normalized log distance map between domains (Figs. 3 / 5);
# - why a perfect ARI can come from outputs that hardly differ at all, and how to check the spread before
#   trusting it;
# - what FedL2P's sparsity looks like across the label-shift and domain scenarios (Fig. 2).
#
# **Prerequisites**: [the method](01_method.ipynb) and [domains](03_domains.ipynb). **Next**: the other
# papers, e.g. [pFedHN](../pfedhn/).
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) the tables and figures
# are drawn from the committed results `results/cpu/<experiment>.json`, nothing trains; the distance maps and
# $\eta$ by domain come from the per-client arrays those results store (a result without them shows the
# committed figure file instead), and `source = "train"` draws them from a fresh run. Where pflkit's defaults differ from the papers: the fidelity ledger,
# [docs/fidelity.md](../../docs/fidelity.md).
#
# ## What is clustered
# For every client $i$ we have the meta-nets' inputs and outputs (Eq. 3, 4): BNNet's input $\xi_i$ (how far
# its BN statistics are from the pretrained ones, per BN layer) and output $\boldsymbol\beta_i$; LRNet's input
# $(E(x_0), SD(x_0), \dots, E(x_{M-1}), SD(x_{M-1}))$, the *features*, and output $\boldsymbol\eta_i$. Each is
# clustered by spectral clustering of an RBF similarity of Euclidean distances (sec. 4.4); the clusters are
# scored against the domains by the adjusted Rand index, 1 for the domains exactly, about 0 for chance.
# Figs. 3 / 5 show, for domains $j, k$ with $d(j, k)$ the mean distance between their clients,
# $$D(j, k) = \log \frac{d(j, k)}{\sqrt{d(j, j)\, d(k, k)}} ,$$
# above 0 off the diagonal when clients of different domains are farther apart than clients of one domain.
#
# The run is `pflkit/catalog/fedl2p/fedl2p_analysis_digits.toml` (MNIST / MNIST-M / USPS, 3 domains x 10
# clients, Dir(0.5): the offline stand-in for DomainNet $\alpha = 0.5$, whose ARIs the paper column shows).

# %% tags=["install"] cellView="form" jupyter={"source_hidden": true}
#@title Install pflkit (Colab or a fresh machine; skipped where it is installed) { display-mode: "form" }
# Skipped when pflkit and the packages its notebooks use all import, also after "Restart runtime". An
# install that was interrupted (a clone whose dependencies are missing) is completed. The clone goes to
# "pflkit-src": a folder named "pflkit" here would shadow the package.
import importlib
import subprocess
import sys
from pathlib import Path

src = Path("pflkit-src").absolute()
if (src / "pflkit" / "__init__.py").exists() and str(src) not in sys.path:
    sys.path.insert(0, str(src))  # beats a stray pflkit/ folder in the working directory
needed = ["pflkit.cli", "torch", "numpy", "matplotlib", "seaborn", "pandas", "sklearn", "tqdm", "papermill"]
try:  # a real install imports its submodules from a regular package (a namespace one has no __file__)
    for name in needed:
        importlib.import_module(name)
    installed = getattr(sys.modules["pflkit"], "__file__", None) is not None
except ImportError:
    installed = False
if not installed:
    if not (src / "pyproject.toml").exists():
        subprocess.run(["git", "clone", "--depth", "1", "https://github.com/pflkit/pflkit.git", str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{src}[notebooks]"], check=True)
    # usable now, without a restart: the clone on sys.path, a stale namespace "pflkit" forgotten
    sys.path.insert(0, str(src))
    for mod in [m for m in sys.modules if m == "pflkit" or m.startswith("pflkit.")]:
        del sys.modules[mod]
    importlib.invalidate_caches()

# %% tags=["parameters"]
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu: the committed results; paper: a GPU's sizes
source = "results"  # results: draw from the committed results (no training); train: train here
out_dir = "runs/fedl2p_analysis"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
experiment = "fedl2p_analysis_digits"
conditioning = "fedl2p_conditioning_digits"  # the run behind section 5 (None: skip it)
results_root = None  # train mode: a folder of saved runs (<results_root>/<experiment>/) to read instead
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from pflkit.analysis.clustering import cluster_ari, report_matrix
from pflkit.data.base import DatasetNotFoundError
from pflkit.notebooks.session import figures_root, setup
from pflkit.report import readings
from pflkit.report.committed import MissingResultError, results_dir as committed_dir
from pflkit.report.fedl2p.figures import (
    ari_table, plot_distance_map, plot_hyperparameters_by_domain, published_ari,
)
from pflkit.report.fedl2p.learned import (
    ari_frame, client_report, drawable, learned, learned_reading, meta_rounds, plot_learned, plot_sparsity_scenarios,
)
from pflkit.report.figures import save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
cfg = session.resolve(experiment)
display(Markdown(f"**{experiment}**: {cfg.title}, on {session.dataset_label(cfg)}"))
session.run_times([experiment] + ([conditioning] if conditioning else []))


def committed_figure(file: str, run: str) -> None:
    """Results mode: the committed figure ``figures/fedl2p/<file>`` (made from run ``run``), or one sentence."""
    path = figures_root() / "fedl2p" / file
    if path.exists():
        display(Image(filename=str(path)))
        display(Markdown(f"*The committed figure `figures/fedl2p/{file}`, drawn from a fresh run of `{run}` at "
                         f"preset cpu whose numbers equal the committed result's (`figures/fedl2p/README.md`).* "
                         f"To draw it here: `source = \"train\"` (the batch trained it in {session.training_time(run)})."))
    else:
        display(Markdown(f"This figure needs the run's full per-client report: `source = \"train\"` "
                         f"({session.training_time(run)} in the committed batch)."))


def domain_names(res):
    """The dataset's domain names, or None (with one line) when the dataset is not available here."""
    used = res["config"]["data"]["dataset"]
    try:
        return session.load(used, **res["config"]["data"]["options"]).meta.group_names.get("domain")
    except DatasetNotFoundError:
        display(Markdown(f"{used} is not available here: domains are shown by their index."))
        return None

# %% [markdown]
# ## 1. The run
# *Look for*: the accuracies are Table 3's row on the same data (see [03_domains](03_domains.ipynb)); here they
# only say the run is sound.

# %%
results = session.run(experiment, results_root=results_root)
run_dir = session.run_dir(experiment, results_root)
data_label = session.dataset_label(results)
display(readings.accuracy_frame(results, "paper (on DomainNet)"))
summary = learned(results, "FedL2P", seed, run_dir)
names = domain_names(results)

# %% [markdown]
# ## 2. Table 6: ARI of the meta-nets' inputs and outputs against the domains
# *Look for*: inputs ($\xi$, features) near 1 mean the clients' data do differ by domain; outputs ($\beta$,
# $\eta$) near 1 would mean the meta-nets personalize by domain. The ARI is scale-free (the clustering's kernel
# width follows the median distance): outputs that differ by $10^{-6}$ cluster like the inputs they come from,
# so read it beside the spread in sections 3 and 4.

# %%
published = published_ari(cfg.published_detail)
report, domains = client_report(results, "FedL2P", seed, run_dir if source == "train" else None)
if report is not None:
    table = ari_table(report, domains, published, seed=seed)
    rng = np.random.default_rng(seed)
    table["random features"] = [round(cluster_ari(rng.normal(size=report_matrix(report, q).shape), domains), 3)
                                for q in table["quantity"]]
    table = table.set_index("quantity")
else:
    table = ari_frame(summary or {}, published)
table = table.rename(columns={"ARI": f"ARI on {data_label}", "paper": "paper (Table 6, DomainNet α = 0.5)"})
display(table)
ari = (summary or {}).get("ari") or {}
if ari:
    display(Markdown("ARI, ours against the paper's: " + ", ".join(
        f"{k} {ari[k]:.2f}" + ("" if published is None or published[j] is None else f" ({published[j]:.2f})")
        for j, k in enumerate(("xi", "beta", "features", "eta")) if k in ari) + "."))

# %% [markdown]
# ## 3. Figs. 3 / 5: normalized log distance maps between domains
# *Look for*: the off-diagonal cells. Red (above 0): clients of those two domains are farther apart than
# clients within each; blue: closer.

# %%
if report is not None:
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4), gridspec_kw={"wspace": 0.6})
    for ax, q in zip(axes, ("xi", "beta", "features", "eta")):
        plot_distance_map(report, domains, q, names=names, ax=ax, title=f"{q} (ARI {ari.get(q, float('nan')):.2f})")
        if ax is not axes[0]:
            ax.set_ylabel("")  # one domain label for the row: the colour bar's label sits beside the next map
    fig.suptitle(f"{experiment} ({data_label}): log normalized distances between domains", y=1.02)
    save_figure(fig, session.figure(f"{experiment}_distance_maps.png"))
    plt.show()
else:
    committed_figure(f"{experiment}_distance_maps.png", experiment)

# %% [markdown]
# ## 4. Fig. 2 / 4: what FedL2P learned, and the sparsity per scenario
# *Look for*: whether $\beta$ and the sparsity differ between clients at all; a quantity without visible
# spread is stated, not drawn. The paper: $\beta = 0$ for every client on CIFAR-10 label shift (Fig. 2a),
# above 0 on the domain datasets (Fig. 2b-d); sparsity high for label shift, 0 for the domains.

# %%
if drawable(summary):
    fig = plot_learned(summary, f"{experiment} ({data_label}): FedL2P, preset {preset}", names)
    save_figure(fig, session.figure(f"{experiment}_hyperparameters.png"))
    plt.show()
display(Markdown(learned_reading(summary, "FedL2P", names)))

# %% [markdown]
# $\beta$ per BN layer and $\eta$ per tensor (divided by its median over clients), one box per domain; the
# titles give the standard deviation between the domain means and inside the domains.
#
# *Look for*: boxes of zero height along a flat line at 1: every client gets the same $\eta$, whatever its
# domain, even where the ARI above is 1.

# %%
if report is not None:
    fig = plot_hyperparameters_by_domain(report, domains, names, f"{experiment} ({data_label}): β / η by domain")
    save_figure(fig, session.figure(f"{experiment}_hyperparameters_by_domain.png"))
    plt.show()
else:
    committed_figure(f"{experiment}_hyperparameters_by_domain.png", experiment)

# %% [markdown]
# The sparsity of every committed FedL2P row of Tables 2 (label shift) and 3 (domains), from the compact results.
#
# *Look for*: which scenarios freeze any parameters; the paper's label-shift rows freeze many.

# %%
scenarios = {}
try:
    for path in sorted(committed_dir(preset, results_dir).glob("fedl2p_table[23]_*.json")):
        row = session.committed(path.stem)
        s = learned(row, "FedL2P", seed)
        if s:
            scenarios[path.stem.replace("fedl2p_", "")] = s
except MissingResultError:
    display(Markdown(f"No committed results of preset {preset}: only this run is shown."))
if not scenarios and summary:
    scenarios[experiment.replace("fedl2p_", "")] = summary
kinds = {k: "label shift (Table 2)" if k.startswith("table2") else "domains (Table 3)" for k in scenarios}
ax = plot_sparsity_scenarios(scenarios, f"FedL2P's sparsity per scenario (preset {preset}, seed {seed})", kinds)
save_figure(ax.figure, session.figure("fedl2p_sparsity_by_scenario.png"))
plt.show()
frozen = {k: float(np.mean(v["sparsity_per_client"])) for k, v in scenarios.items()}
nonzero = {k: v for k, v in frozen.items() if v > 0}
display(Markdown(f"{len(nonzero)} of {len(frozen)} scenarios freeze any parameters"
                 + (": " + ", ".join(f"{k} {v:.3f}" for k, v in nonzero.items()) if nonzero else "")
                 + ". " + ("Every Table 2 (label-shift) row has sparsity 0: the paper's high label-shift sparsity "
                           "does not show at this preset." if not any(k.startswith("table2") for k in nonzero) else "")))

# %% [markdown]
# ## 5. Why they hardly differ between domains: `fedl2p_conditioning_digits`
# The same three digit domains with Dir(0.1) label skew inside each and more meta-rounds (its experiment file
# says why). The README and the fidelity ledger (meta-net initialization gain) point here: with App. E's gain
# 0.1 in every layer the meta-nets' outputs move little per unit of input.
#
# *Look for*: whether longer meta-learning makes $\beta$ or the sparsity vary across clients.

# %%
if conditioning:
    cond = session.run(conditioning, results_root=results_root)
    cond_dir = session.run_dir(conditioning, results_root)
    cond_summary = learned(cond, "FedL2P", seed, cond_dir)
    if drawable(cond_summary):
        fig = plot_learned(cond_summary, f"{conditioning}: FedL2P after {meta_rounds(cond)} meta-rounds", names)
        save_figure(fig, session.figure(f"{conditioning}_hyperparameters.png"))
        plt.show()
    display(Markdown(f"{conditioning} learned the meta-nets for {meta_rounds(cond)} rounds ({experiment}: "
                     f"{meta_rounds(results)}). " + learned_reading(cond_summary, "FedL2P", names)))
    cond_report, cond_domains = client_report(cond, "FedL2P", seed, cond_dir if source == "train" else None)
    if cond_report is not None:
        fig = plot_hyperparameters_by_domain(cond_report, cond_domains, names,
                                             f"{conditioning}: β / η by domain (preset {preset})")
        save_figure(fig, session.figure(f"{conditioning}_hyperparameters_by_domain.png"))
        plt.show()
    else:
        committed_figure(f"{conditioning}_hyperparameters_by_domain.png", conditioning)

# %% [markdown]
# ## Takeaways
# Generated from the paper's claims that pflkit checks (`pflkit.report.claims`) on these runs.

# %%
claims = session.checked_claims("fedl2p", [experiment] + ([conditioning] if conditioning else []), results_root)
checked = [c for c in claims if c.verdict != "not run"]
lines = [readings.takeaways(checked, preset)]
if ari and summary:
    b = np.asarray(summary["beta_per_client"], dtype=float)
    lines.append(f"- β's ARI is {ari.get('beta', float('nan')):.2f} while its spread across all clients is "
                 f"{b.max() - b.min():.2g} on a [0, 1] scale: "
                 + ("a clustering of values this close echoes the inputs' clusters and says nothing about "
                    "personalization." if b.max() - b.min() < 0.01 else "the domains get visibly different β."))
if len(checked) < len(claims):
    lines.append(f"- {len(claims) - len(checked)} more of the paper's claims need other rows: "
                 "[02_label_shift](02_label_shift.ipynb) and [03_domains](03_domains.ipynb) check them.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. **More label skew.** Set `experiment = "fedl2p_table3_digits_a0p1"` (results mode): does the ARI of
#    $\xi$ drop when each domain's clients also differ by label? Compare with the table above.
# 2. **A stronger meta-net.** Set `source = "train"` and add the override of the meta-nets' hidden gain
#    (`hidden_gain`, see the fidelity ledger) to `session.run(experiment, ...)`. Does $\beta$ now spread across
#    clients, and does its ARI stay at 1? The reference is the committed `results/cpu/fedl2p_analysis_digits.json`.
# 3. **Corruptions.** Set `experiment = "fedl2p_table3_cifar10c_a0p5"`: its sparsity differs from client to
#    client (section 4's figure): which corruptions freeze more?
