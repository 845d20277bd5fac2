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
# # pflkit quickstart: label shift, FedAvg, and three ways to fine-tune
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/tutorials/00_quickstart.ipynb)
#
# This notebook walks through the embedded default experiment (`pflkit demo`):
#
# 1. load scikit-learn's handwritten digits (they ship with scikit-learn, so this runs offline);
# 2. split them among clients with **Dirichlet label shift** (FedL2P sec. 4.1: each client's label
#    proportions are drawn from Dir(alpha); small alpha = very different clients);
# 3. train a **global model with FedAvg**;
# 4. **personalize** it on every client by fine-tuning, in the three ways FedL2P compares (sec. 4.1.2):
#    normalizing with the client's batch-norm statistics (BN C), the global model's (BN G),
#    or each incoming batch's (BN I).
#
# The `preset` parameter sets the size: `smoke` (seconds, what the tests run), `cpu` (the README's numbers),
# `paper` (longer). A preset changes sizes only, never the algorithm.

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
out_dir = "runs/quickstart"
data_root = None
seed = 0

# %%
from pathlib import Path

import matplotlib.pyplot as plt

from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.fl.federation import build_federation
from pflkit.report.figures import plot_label_distribution, plot_methods, plot_rounds, save_figure
from pflkit.report.tables import format_table, results_table
from pflkit.runner import run_experiment

out = Path(out_dir)
# figures from full runs go to the repository's figures/ folder; smoke runs keep theirs in out_dir
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/tutorials")
cfg = resolve("demo", preset, [f"seed={seed}"])
print(cfg.title)

# %% [markdown]
# ## 1. The data and the clients
# `build_federation` partitions the pooled samples, then holds out 20% of each client's samples for test
# and 20% of the rest for validation (FedL2P's ratios). Each bar below is one client; colours are digit classes.

# %%
dataset = load_dataset(cfg.data.dataset, data_root)
d = cfg.data
fed = build_federation(dataset, d.scheme, d.num_clients, seed=seed, split=d.split,
                       test_fraction=d.test_fraction, val_fraction=d.val_fraction, **d.partition)
ax = plot_label_distribution(fed)
save_figure(ax.figure, fig_dir / "label_distribution.png")
plt.show()
print("train samples per client:", fed.sizes("train"))

# %% [markdown]
# ## 2. FedAvg, then fine-tuning on every client
# `run_experiment` trains the pretraining stage (FedAvg: each round a fraction of clients trains locally and the
# server averages their weights, weighted by sample count), tests the global model on each client
# ("Global"), then fine-tunes it on each client's train split with each BN mode and tests it.
# Everything lands in `results.json`.

# %%
results = run_experiment(cfg, out, data_root=data_root, progress=False)
print(format_table(results))

# %%
ax = plot_rounds(results, "val_acc")
ax.set_title("FedAvg: mean validation accuracy over clients")
save_figure(ax.figure, fig_dir / "fedavg_rounds.png")
plt.show()

# %%
ax = plot_methods(results)
save_figure(ax.figure, fig_dir / "demo_methods.png")
plt.show()

# %% [markdown]
# ## 3. Reading the table
# Under label shift, each client sees only a few classes. The global model must serve all clients, so
# fine-tuning it on the client's own data usually helps (FedL2P Table 2, alpha = 0.1). Which BN statistics
# help depends on the shift: here all clients draw from one image domain, so the global statistics are
# sensible; under feature shift (other domains, corruptions) the client's statistics matter more.
# Per-client accuracies are in `results["methods"][label]["per_client"]`:

# %%
table = results_table(results)
table[["method", "ours", "status"]]

# %%
import numpy as np

per_client = {label: np.array(m["per_client"][0]) for label, m in results["methods"].items()}
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.boxplot(list(per_client.values()), tick_labels=list(per_client))
ax.set_ylabel("client test accuracy (%)")
save_figure(fig, fig_dir / "per_client_accuracy.png")
plt.show()
