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
# # pFedHN Fig. 4: what the client embeddings learn
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/05_embeddings.ipynb)
#
# Each client has a trainable embedding v_i, the hypernetwork's input (sec. 5.5). If the hypernetwork shares
# information sensibly, clients with similar data should get nearby embeddings. The paper builds CIFAR-100
# clients that each draw from one coarse class and shows a t-SNE of the embeddings coloured by coarse class.
# Offline we use the same design on Omniglot: every client draws from a single alphabet (several clients per
# alphabet). Beside the picture, two numbers measured on the embeddings themselves: the share of clients whose
# nearest other client shares their alphabet (chance in brackets), and the silhouette of the alphabet groups.

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
out_dir = "runs/pfedhn_embeddings"
data_root = None
seed = 0

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from pflkit.algorithms.pfedhn import embeddings
from pflkit.analysis.embeddings import embedding_report, plot_embeddings, tsne_2d
from pflkit.analysis.pfedhn import experiment_federation, train_method
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.report.figures import save_figure
from pflkit.runner import make_env

if preset == "smoke":
    torch.set_num_threads(1)  # tests run many notebooks side by side on few cores
root = data_root or ("../../../shared/data" if Path("../../../shared/data").is_dir() else None)
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/pfedhn")
# offline without Omniglot (fresh Colab / CI): digits clients that each hold one digit, grouped by that digit
fallback = [] if root else ["data.dataset=digits", "model.name=mlp", "model.options={}", "data.scheme=pathological",
                            "data.partition={classes_per_client = 1}", "data.split=paired", "data.num_clients=20"]
exp = resolve("pfedhn_fig4_embeddings", preset, [f"seed={seed}"] + fallback)
dataset = load_dataset(exp.data.dataset, root, **exp.data.options)
fed = experiment_federation(exp, dataset)
if root:
    groups = fed.group_of_clients("alphabet")
    names = dataset.meta.group_names["alphabet"]
else:
    groups, names = fed.histograms().argmax(1), dataset.meta.class_names
print(exp.title, "|", fed.num_clients, "clients; clients per group:", np.bincount(groups))

# %%
env = make_env(exp, fed, seed)
res = train_method(exp, "pFedHN", fed, env)
emb = embeddings(res.state).numpy()
report = embedding_report(emb, groups)
print(f"pFedHN: mean test accuracy {100 * res.summary['acc']:.2f}% (embedding dim {emb.shape[1]})")
print(f"nearest-neighbour group agreement {report['neighbour_agreement']:.2f} (chance {report['chance']:.2f}), "
      f"silhouette {report['silhouette']:.2f}")

# %%
xy = tsne_2d(emb, seed=seed)
ax = plot_embeddings(xy, groups, names, title=f"t-SNE of pFedHN client embeddings\n1-NN same group "
                     f"{report['neighbour_agreement']:.2f} (chance {report['chance']:.2f}), silhouette {report['silhouette']:.2f}")
save_figure(ax.figure, fig_dir / "embeddings_tsne.png")
plt.show()
