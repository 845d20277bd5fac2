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
# # FedL2P Tables 3, 5 and 8: feature shift and domains
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/03_domains.ipynb)
#
# **Table 3** (sec. 4.3-4.4): clients whose *features* differ. CIFAR-10-C: the CIFAR-10 test images under ten
# corruptions, one domain per corruption, each split among clients with Dirichlet(alpha) labels.
# Office-Caltech-10 and DomainNet: real image domains (offline, MNIST / MNIST-M / USPS play that role).
# **Table 5** ablates the meta-nets (BNNet alone; LRNet alone with beta fixed to 1 or 0). **Table 8** learns the
# same meta-nets with FOMAML+ meta-gradients instead of the implicit-function-theorem hypergradient.
#
# The paper's finding to look for: with distinct domains the learned beta is clearly above 0 (each client
# mixes in its own BN statistics, Fig. 2b-d), unlike CIFAR-10 label shift where it goes to 0.
#
# Parameters: `dataset` is `digits` (MNIST / MNIST-M / USPS, offline), `cifar10c`, `domainnet` or `caltech10`;
# `alpha` the Dirichlet row (`1000`, `1p0`, `0p5`, `0p1`; `c3` / ignored for the one-client-per-domain rows);
# `table` 3, 5 or 8. The run is `pflkit/catalog/fedl2p/fedl2p_table{table}_{dataset}_a{alpha}.toml`.
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
out_dir = "runs/fedl2p_domains"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
seeds = 1
dataset = "digits"  # digits, cifar10c, domainnet, caltech10
alpha = "0p5"  # 1000, 1p0, 0p5, 0p1; c3: the digits row with one client per domain; caltech10 ignores it
table = 3  # 3, 5 or 8
results_root = None

# %%
import matplotlib.pyplot as plt
import numpy as np

from pflkit.data.corruptions import CORRUPTIONS, corrupt
from pflkit.notebooks import setup
from pflkit.report.fedl2p import (
    beta_summary, client_groups, load_report, plot_hyperparameters, plot_hyperparameters_by_domain, versus_finetuning,
)
from pflkit.report.figures import plot_methods, save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
suffix = "" if dataset == "caltech10" else ("_c3" if alpha == "c3" else f"_a{alpha}")
name = f"fedl2p_table{table}_{dataset}{suffix}"
cfg = session.resolve(name, f"seeds={seeds}")
data_label = session.dataset_label(cfg)
print(name, "-", cfg.title, "|", data_label)

# %% [markdown]
# ## 1. What the corruptions look like
# pflkit makes CIFAR-10-C itself (`pflkit.data.corruptions`, the published severity-3 parameters; `frost` uses a
# procedural frost texture since the published photographs are not shipped). Rows: clean, then each corruption.

# %%
if cfg.data.dataset == "cifar10c":
    clean = session.load("cifar10").x_test[:6].permute(0, 2, 3, 1).numpy()
    grid = np.concatenate([np.concatenate(list(clean), 1)] +
                          [np.concatenate(list(corrupt(clean, c, 3, seed=seed)), 1) for c in CORRUPTIONS], 0)
    fig, ax = plt.subplots(figsize=(6, 11))
    ax.imshow(grid)
    ax.set_yticks(16 + 32 * np.arange(len(CORRUPTIONS) + 1), ["clean", *CORRUPTIONS])
    ax.set_xticks([])
    save_figure(fig, session.figure("cifar10c_examples.png"))
    plt.show()
else:
    print(f"this run is on {data_label}: corruption examples are shown for dataset = 'cifar10c'")

# %% [markdown]
# ## 2. The table row

# %%
results = session.run(name, f"seeds={seeds}", results_root=results_root)
run_dir = session.run_dir(name, results_root)
print(session.format_table(results))
label = "FedL2P (IFT)" if "FedL2P (IFT)" in results["methods"] else "FedL2P"
print(f"{label} vs the best FT baseline:", versus_finetuning(results, label))
ax = plot_methods(results)
ax.set_title(f"{name}: {session.dataset_label(results)}")
save_figure(ax.figure, session.figure(f"{name}_methods.png"))
plt.show()

# %% [markdown]
# ## 3. beta per domain
# Each client's mean beta over its BN layers, grouped by its domain (corruption / source). Above 0 means the
# client mixes in its own statistics; the paper finds this for every domain dataset.

# %%
report = load_report(run_dir, label, seed)
print(beta_summary(report))
key = "corruption" if results["config"]["data"]["dataset"] == "cifar10c" else "domain"
groups = names = None
try:
    groups = client_groups(run_dir, key, seed)
    names = session.load(cfg.data.dataset, **cfg.data.options).meta.group_names.get(key)
    mean_beta = np.array([np.mean(list(r["beta"].values())) for r in report])
    fig, ax = plt.subplots(figsize=(5, 3))
    ids = np.unique(groups)
    ax.boxplot([mean_beta[groups == g] for g in ids], tick_labels=[names[g] if names else g for g in ids])
    ax.set_ylabel("client's mean beta")
    ax.tick_params(axis="x", rotation=45)
    save_figure(fig, session.figure(f"{name}_beta_by_domain.png"))
    plt.show()
except KeyError as err:
    print(f"no per-client {key} groups on {data_label}: {err}")

# %% [markdown]
# ## 4. beta and eta per domain, with their spread
# Per BN layer (beta) and per tensor (eta divided by its median over clients), one box per domain. The titles give
# the standard deviation between the domain means and inside the domains: a flat line at 1 / boxes of zero height
# mean the meta-nets give every client the same hyperparameters, whatever the ARI of their clustering says
# (`pflkit.analysis.clustering.group_spread`).

# %%
if groups is not None:  # None: the clients carry no groups (see above)
    fig = plot_hyperparameters_by_domain(report, groups, names,
                                         f"{name} ({data_label}): {label}'s beta / eta by {key} (preset {preset})")
    save_figure(fig, session.figure(f"{name}_hyperparameters_by_domain.png"))
    plt.show()

# %%
fig = plot_hyperparameters(report, f"{name} ({data_label}): {label}'s hyperparameters (preset {preset})")
save_figure(fig, session.figure(f"{name}_hyperparameters.png"))
plt.show()

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("fedl2p", [name], results_root)
print(meaning)
claims
