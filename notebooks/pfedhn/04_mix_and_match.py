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
# # pFedHN Fig. 3: are the generated feature extractors really personal?
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/04_mix_and_match.ipynb)
#
# pFedHN-PC (sec. 3.3) lets the hypernetwork generate each client's feature extractor theta_i while the client
# keeps its own classifier omega_i. With a personal classifier, the hypernetwork *could* give everyone the same
# feature extractor. Sec. 5.4 tests this: train on CIFAR-10 split among 10 clients with 2 classes each, then
# evaluate client i's test data with client j's feature extractor and client i's own classifier. Rows: clients
# (their classifier and data); columns: whose feature extractor. Values are accuracies normalized per row,
# (acc_ij - min_l acc_il) / (max_l acc_il - min_l acc_il).

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
out_dir = "runs/pfedhn_mix_and_match"
data_root = None
seed = 0

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

from pflkit.analysis.pfedhn import (client_classes, experiment_federation, method_config, mix_and_match, row_normalize,
                                    train_method)
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.report.figures import save_figure
from pflkit.runner import make_env

if preset == "smoke":
    torch.set_num_threads(1)  # tests run many notebooks side by side on few cores
root = data_root or ("../../../shared/data" if Path("../../../shared/data").is_dir() else None)
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/pfedhn")
fallback = [] if root else ["data.dataset=digits", "model.name=mlp", "model.options={}"]
exp = resolve("pfedhn_fig3_mixmatch", preset, [f"seed={seed}"] + fallback)
dataset = load_dataset(exp.data.dataset, root)
fed = experiment_federation(exp, dataset)
env = make_env(exp, fed, seed)
res = train_method(exp, "pFedHN-PC", fed, env)
print(f"pFedHN-PC, {fed.num_clients} clients: mean test accuracy {100 * res.summary['acc']:.2f}%")

# %%
_, cfg = method_config(exp, "pFedHN-PC")
acc = mix_and_match(res.state, res.client_states, fed, cfg, env)
labels = [" / ".join(c) for c in client_classes(fed)]
off = acc[~np.eye(len(acc), dtype=bool)]
print(f"own feature extractor: {100 * np.diag(acc).mean():.1f}% on average; another client's: {100 * off.mean():.1f}%")
fig, ax = plt.subplots(figsize=(7.5, 6))
sns.heatmap(row_normalize(acc), annot=len(acc) <= 12, fmt=".2f", cmap="viridis", xticklabels=labels,
            yticklabels=labels, ax=ax, cbar_kws={"label": "row-normalized accuracy"})
ax.set_xlabel("feature extractor of client j")
ax.set_ylabel("client i (its data and classifier)")
ax.set_title("pFedHN-PC mix-and-match (Fig. 3)")
fig.tight_layout()
save_figure(fig, fig_dir / "mix_and_match.png")
plt.show()
