# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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
# `table` 3, 5 or 8. The run is `experiments/fedl2p/fedl2p_table{table}_{dataset}_a{alpha}.toml`.

# %% tags=["install"]
# Colab / fresh machine: install pflkit once (skipped when it is already importable)
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("pflkit") is None:
    subprocess.run(["git", "clone", "--depth", "1", "https://github.com/pflkit/pflkit.git"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "pflkit"], check=True)
    sys.path.insert(0, "pflkit")

# %% tags=["parameters"]
preset = "cpu"
out_dir = "runs/fedl2p_domains"
data_root = None
seed = 0
seeds = 1
dataset = "digits"  # digits, cifar10c, domainnet, caltech10
alpha = "0p5"  # 1000, 1p0, 0p5, 0p1 (caltech10 and the digits "c3" row have one client per domain)
table = 3  # 3, 5 or 8
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from pflkit.data.base import DatasetNotFoundError
from pflkit.data.corruptions import CORRUPTIONS, corrupt
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.io import read_json
from pflkit.report.fedl2p import beta_summary, client_groups, load_report, plot_hyperparameters, versus_finetuning
from pflkit.report.figures import plot_methods, save_figure
from pflkit.report.tables import format_table
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tiny models on a shared CPU: one thread avoids oversubscription
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/fedl2p")
shared = Path("../../../shared/data")
root = data_root or (str(shared) if shared.is_dir() else None)
suffix = "" if dataset == "caltech10" else ("_c3" if alpha == "c3" else f"_a{alpha}")
name = f"fedl2p_table{table}_{dataset}{suffix}"
cfg = resolve(name, preset, [f"seed={seed}", f"seeds={seeds}"])
try:
    load_dataset(cfg.data.dataset, root, **cfg.data.options)
except DatasetNotFoundError as err:
    print(f"{cfg.data.dataset} not found ({str(err).splitlines()[0]}): running the embedded digits demo instead")
    name, cfg = "demo", resolve("demo", preset, [f"seed={seed}"])
print(name, "-", cfg.title)

# %% [markdown]
# ## 1. What the corruptions look like
# pflkit makes CIFAR-10-C itself (`pflkit.data.corruptions`, the published severity-3 parameters; `frost` uses a
# procedural frost texture since the published photographs are not shipped). Rows: clean, then each corruption.

# %%
try:
    clean = load_dataset("cifar10", root).x_test[:6].permute(0, 2, 3, 1).numpy()
    grid = np.concatenate([np.concatenate(list(clean), 1)] +
                          [np.concatenate(list(corrupt(clean, c, 3, seed=seed)), 1) for c in CORRUPTIONS], 0)
    fig, ax = plt.subplots(figsize=(6, 11))
    ax.imshow(grid)
    ax.set_yticks(16 + 32 * np.arange(len(CORRUPTIONS) + 1), ["clean", *CORRUPTIONS])
    ax.set_xticks([])
    save_figure(fig, fig_dir / "cifar10c_examples.png")
    plt.show()
except DatasetNotFoundError:
    print("CIFAR-10 not found: no corruption examples")

# %% [markdown]
# ## 2. The table row

# %%
run_dir = Path(results_root) / name if results_root else out / name
if results_root and (run_dir / "results.json").exists():
    results = read_json(run_dir / "results.json")
else:
    results = run_experiment(cfg, run_dir, data_root=root, progress=False)
print(format_table(results))
label = "FedL2P (IFT)" if "FedL2P (IFT)" in results["methods"] else "FedL2P"
print(f"{label} vs the best FT baseline:", versus_finetuning(results, label))
ax = plot_methods(results)
save_figure(ax.figure, fig_dir / f"{name}_methods.png")
plt.show()

# %% [markdown]
# ## 3. beta per domain
# Each client's mean beta over its BN layers, grouped by its domain (corruption / source). Above 0 means the
# client mixes in its own statistics; the paper finds this for every domain dataset.

# %%
report = load_report(run_dir, label, seed)
print(beta_summary(report))
key = "corruption" if cfg.data.dataset == "cifar10c" else "domain"
try:
    groups = client_groups(run_dir, key, seed)
    names = load_dataset(cfg.data.dataset, root, **cfg.data.options).meta.group_names.get(key)
    mean_beta = np.array([np.mean(list(r["beta"].values())) for r in report])
    fig, ax = plt.subplots(figsize=(5, 3))
    ids = np.unique(groups)
    ax.boxplot([mean_beta[groups == g] for g in ids], tick_labels=[names[g] if names else g for g in ids])
    ax.set_ylabel("client's mean beta")
    ax.tick_params(axis="x", rotation=45)
    save_figure(fig, fig_dir / f"{name}_beta_by_domain.png")
    plt.show()
except KeyError as err:
    print(err)

# %%
fig = plot_hyperparameters(report, f"{name}: {label}'s hyperparameters (preset {preset})")
save_figure(fig, fig_dir / f"{name}_hyperparameters.png")
plt.show()
