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
# # FedL2P's analysis: Table 6, Fig. 3 / 5 and Fig. 2 / 4
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/05_analysis.ipynb)
#
# Do the meta-nets know the clients' domains (sec. 4.4)? For every client we have the meta-nets' inputs (BNNet's
# xi: how far its BN statistics are from the pretrained ones; LRNet's x: the mean and SD of every layer's input)
# and outputs (beta, eta). **Table 6** clusters the clients by each of them (spectral clustering of an RBF
# similarity of Euclidean distances, labels by discretization) and scores the clusters against the true domains
# with the adjusted Rand index: 1 = the domains, about 0 = chance. **Fig. 3 / 5** shows the normalized log
# distance between domains, `log(d(j, k) / sqrt(d(j, j) d(k, k)))`: off-diagonal blocks above 0 mean clients of
# different domains are farther apart than clients of the same domain. **Fig. 2 / 4** shows the learned beta and
# eta across clients and the sparsity per scenario.
#
# The run is `pflkit/catalog/fedl2p/fedl2p_analysis_digits.toml` (MNIST / MNIST-M / USPS, 3 domains x 10 clients,
# Dir(0.5): the offline stand-in for DomainNet alpha = 0.5). Point `results_root` at a folder of runs
# (`<results_root>/<experiment>/`) to render them; label-shift and CIFAR-10-C runs found there join Fig. 2.
#
# Where pflkit's defaults differ from the papers (and which option switches each): the fidelity ledger,
# [docs/fidelity.md](../../docs/fidelity.md).

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

# %% [markdown]
# **Data.** Datasets are read from `data_root`, then `$PFLKIT_DATA`, then pflkit's cache, or downloaded when
# `download` is on (`data/README.md` says how to get each one); a missing dataset stops the notebook with an error
# that says where it looked. `standin = True` runs the same methods on sklearn digits instead: titles and tables
# then say STAND-IN, and the paper's column names the paper's dataset.

# %% tags=["parameters"]
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu; paper
out_dir = "runs/fedl2p_analysis"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
experiment = "fedl2p_analysis_digits"
conditioning = "fedl2p_conditioning_digits"  # the run behind section 5 (None: skip it)
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from pflkit.analysis.clustering import cluster_ari, report_matrix
from pflkit.notebooks import setup
from pflkit.report.fedl2p import (
    ari_table, beta_summary, client_groups, load_report, plot_distance_map, plot_hyperparameters,
    plot_hyperparameters_by_domain, plot_sparsity, published_ari, report_path,
)
from pflkit.report.figures import save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
cfg = session.resolve(experiment)
data_label = session.dataset_label(cfg)
print(experiment, "|", data_label)

# %% [markdown]
# ## 1. The run

# %%
results = session.run(experiment, results_root=results_root)
run_dir = session.run_dir(experiment, results_root)
data_label = session.dataset_label(results)
print(session.format_table(results))
report = load_report(run_dir, "FedL2P", seed)


def groups_of(res, folder, rows):
    """(key, group names, each client's group) of a run: its dataset's domains (corruptions on CIFAR-10-C);
    names None and three arbitrary groups where the dataset has none (e.g. the digits stand-in)."""
    used = res["config"]["data"]["dataset"]
    key = "corruption" if used == "cifar10c" else "domain"
    names = session.load(used, **res["config"]["data"]["options"]).meta.group_names.get(key)
    return key, names, client_groups(folder, key, seed) if names is not None else np.arange(len(rows)) % 3


key, names, domains = groups_of(results, run_dir, report)
if names is None:
    print(f"{data_label} has no {key}s: three arbitrary client groups stand in for them, so the ARIs below "
          "only show the pipeline (expect about 0)")
print("clients per domain:", dict(zip(*np.unique(domains, return_counts=True))))

# %% [markdown]
# ## 2. Table 6: ARI of the meta-nets' inputs and outputs against the domains
# Published: DomainNet alpha = 0.5 (the role these digits play). Beside it, a check of the scale: the ARI of
# the same clustering applied to random features (about 0).
#
# The ARI is scale-free (the clustering's kernel width follows the median distance): outputs that differ between
# clients by 1e-6 cluster exactly like the inputs they are computed from. So every row also gives the spread of
# the clustered quantity: `between` / `within` (standard deviation between the domain means / inside the domains,
# root mean square over the coordinates), the same relative to the coordinates' size (`/ level`), and
# `near-constant` when the between-domain spread is under 0.1% of the level: an output ARI there says nothing
# about personalization.

# %%
table = ari_table(report, domains, published_ari(cfg.published_detail), seed=seed)
table = table.rename(columns={"ARI": f"ARI on {data_label}", "paper": "paper (Table 6, the scenario this file stands for)"})
rng = np.random.default_rng(seed)
table["random features"] = [round(cluster_ari(rng.normal(size=report_matrix(report, q).shape), domains), 3)
                            for q in table["quantity"]]
table

# %% [markdown]
# ## 3. Fig. 3 / 5: normalized log distance maps between domains

# %%
fig, axes = plt.subplots(1, 4, figsize=(18, 3.8), gridspec_kw={"wspace": 0.5})
for ax, q in zip(axes, ("xi", "beta", "features", "eta")):
    plot_distance_map(report, domains, q, names=names, ax=ax, title=q)
fig.suptitle(f"{cfg.name} ({data_label}): log normalized distances (> 0 off the diagonal = domains apart)")
save_figure(fig, session.figure(f"{cfg.name}_distance_maps.png"))
plt.show()

# %% [markdown]
# ## 4. Fig. 2 / 4: learned hyperparameters and sparsity per scenario
# The paper: beta = 0 for every client on CIFAR-10 label shift (Fig. 2a), clearly above 0 on the domain
# datasets (Fig. 2b-d); sparsity high for label shift, 0 for the domains.

# %%
print("this run:", beta_summary(report))
fig = plot_hyperparameters(report, f"{cfg.name} ({data_label}, preset {preset})")
save_figure(fig, session.figure(f"{cfg.name}_hyperparameters.png"))
plt.show()

# %% [markdown]
# The same by domain: beta per BN layer and eta per tensor (divided by its median over clients), one box per
# domain, the between / within-domain spread in the titles.

# %%
fig = plot_hyperparameters_by_domain(report, domains, names, f"{cfg.name} ({data_label}, preset {preset}): by {key}")
save_figure(fig, session.figure(f"{cfg.name}_hyperparameters_by_domain.png"))
plt.show()

# %%
scenarios = {cfg.name.replace("fedl2p_", ""): report}
for path in sorted(Path(results_root).glob("fedl2p_table[23]_*")) if results_root else []:
    if path.name != cfg.name and report_path(path, "FedL2P", seed).exists():
        scenarios[path.name.replace("fedl2p_", "")] = load_report(path, "FedL2P", seed)
for label, rows in scenarios.items():
    s = beta_summary(rows)
    print(f"{label:28s} mean beta {s['mean']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}), "
          f"sparsity {s['sparsity']:.3f}")
ax = plot_sparsity(scenarios)
save_figure(ax.figure, session.figure("fedl2p_sparsity_by_scenario.png"))
plt.show()

# %% [markdown]
# ## 5. Why they hardly differ between domains: `fedl2p_conditioning_digits`
# The same three digit domains with Dir(0.1) label skew inside each and 40 meta-rounds (its experiment file says
# why). Its by-domain picture below is what the README and the fidelity ledger (meta-net initialization gain)
# point to: with App. E's gain 0.1 in every layer the meta-nets' outputs move ~1e-4 per unit of input, so beta
# and eta come out nearly the same for every client whatever its domain.

# %%
if conditioning:
    cond = session.run(conditioning, results_root=results_root)
    cond_dir = session.run_dir(conditioning, results_root)
    cond_label = session.dataset_label(cond)
    cond_report = load_report(cond_dir, "FedL2P", seed)
    _, cond_names, cond_domains = groups_of(cond, cond_dir, cond_report)
    print(f"{conditioning}:", beta_summary(cond_report))
    fig = plot_hyperparameters_by_domain(cond_report, cond_domains, cond_names,
                                         f"{conditioning} ({cond_label}, preset {preset}): by domain")
    save_figure(fig, session.figure(f"{conditioning}_hyperparameters_by_domain.png"))
    plt.show()

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("fedl2p", [experiment], results_root)
print(meaning)
claims
