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
# # FedL2P Tables 1 and 2: label shift on CIFAR-10
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/02_label_shift.ipynb)
#
# **Table 2** (sec. 4.2): CIFAR-10 split among clients with Dirichlet(alpha) labels, a global model pretrained
# with FedAvg on the same clients, then personalization by fine-tuning for e epochs with the client's BN
# statistics (FT BN C), the global ones (BN G) or each batch's (BN I), by L2P (the meta-nets learned by every
# client alone) and by FedL2P. **Table 1** swaps the pretraining (FedAvg, Per-FedAvg (HF), FedBABU) and compares
# FT (BN C) with FedL2P at e = 15.
#
# The paper's finding to look for: all clients draw from one image domain, so the learned beta goes to 0
# (keep the pretrained BN statistics, Fig. 2a) and FedL2P lands at or above the best hand-picked baseline.
#
# Every row is a file in `experiments/fedl2p/` (`fedl2p_table2_a0p1_e5`, `fedl2p_table1_fedbabu_a0p5`, ...);
# from a shell: `pflkit run fedl2p_table2_a0p1_e5 --preset cpu --data-root ../shared/data --out runs/t2_a0p1_e5`.
# Set `results_root` to a folder of such runs (`<results_root>/<experiment>/results.json`) to render them
# without retraining; otherwise this notebook runs the row given by `alpha` and `epochs`.

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
out_dir = "runs/fedl2p_label_shift"
data_root = None
seed = 0
seeds = 1
alpha = "0p1"  # one of 1000, 1p0, 0p5, 0p1
epochs = 5  # 5 or 15
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch

from pflkit.data.datasets import load_dataset
from pflkit.data.base import DatasetNotFoundError
from pflkit.experiments import resolve
from pflkit.io import read_json
from pflkit.report.fedl2p import beta_summary, load_report, plot_hyperparameters, versus_finetuning
from pflkit.report.figures import plot_methods, save_figure
from pflkit.report.tables import compare_table, format_table
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tiny models on a shared CPU: one thread avoids oversubscription
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/fedl2p")
shared = Path("../../../shared/data")
root = data_root or (str(shared) if shared.is_dir() else None)
try:
    load_dataset("cifar10", root)
    name = f"fedl2p_table2_a{alpha}_e{epochs}"
except DatasetNotFoundError:
    print("CIFAR-10 not found: running the embedded digits demo instead (same methods, other data)")
    name = "demo"

# %% [markdown]
# ## 1. One row of Table 2
# Methods run in order: FedAvg pretraining ("Global": the global model tested on every client), the three
# FT baselines, L2P and FedL2P. Accuracy is the mean over clients of each client's test accuracy.

# %%
run_dir = Path(results_root) / name if results_root else out / name
if results_root and (run_dir / "results.json").exists():
    results = read_json(run_dir / "results.json")
else:
    cfg = resolve(name, preset, [f"seed={seed}", f"seeds={seeds}"])
    results = run_experiment(cfg, run_dir, data_root=root, progress=False)
print(format_table(results))
print("FedL2P vs the best FT baseline:", versus_finetuning(results))

# %%
ax = plot_methods(results)
save_figure(ax.figure, fig_dir / f"{name}_methods.png")
plt.show()

# %% [markdown]
# ## 2. What FedL2P learned (Fig. 2a)
# beta per BN layer across clients (0 = the pretrained statistics), eta per tensor and the sparsity (share of
# parameters with eta = 0). With the cpu preset's 20 meta rounds beta has less time to travel than in the
# paper's 500.

# %%
report = load_report(run_dir, "FedL2P", seed)
print(beta_summary(report))
fig = plot_hyperparameters(report, f"{name}: FedL2P's hyperparameters (preset {preset})")
save_figure(fig, fig_dir / f"{name}_hyperparameters.png")
plt.show()

# %% [markdown]
# ## 3. All rows found under `results_root`
# Table 2 (alpha x e) and Table 1 (pretraining x alpha) side by side, ours next to the paper's numbers.

# %%
found = sorted(Path(results_root).glob("fedl2p_table[12]_*/results.json")) if results_root else []
runs = [read_json(p) for p in found] or [results]
rows = []
for res in runs:
    c = res["config"]
    for label, m in res["methods"].items():
        rows.append({"experiment": c["name"], "method": label, "ours": m["acc_mean"], "paper": m["published"]})
table = pd.DataFrame(rows).pivot_table(index=["experiment", "method"], values=["ours", "paper"], aggfunc="first")
table.round(2)

# %%
by_alpha = [r for r in runs if r["config"]["table"] == "Table 2"]
if len(by_alpha) > 1:
    print(compare_table(by_alpha, "data.partition.alpha").round(2))
