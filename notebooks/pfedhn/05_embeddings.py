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
#
# **Data and device.** Omniglot is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); when none of these works the notebook stops with an error naming it. `standin=True`
# runs sklearn's digits instead (one digit per client, the digit as its group), and every title, table and
# printout then names the stand-in. `device="auto"` uses a GPU when there is one; figures go to `figures_dir`
# (default `out_dir/figures`).
# With `results_root` pointing at a folder of saved runs (`<results_root>/<experiment>/`, e.g. the work folder of
# `pflkit reproduce`, which keeps this experiment's trained states), the trained model is read from the run made
# with the same settings and data instead of being trained again.
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

# %% tags=["parameters"]
preset = "cpu"
out_dir = "runs/pfedhn_embeddings"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
results_root = None  # a folder of saved runs (<results_root>/<experiment>/), e.g. pflkit reproduce's work folder

# %%
import matplotlib.pyplot as plt
import numpy as np

from pflkit.algorithms.pfedhn import embeddings
from pflkit.analysis.embeddings import embedding_report, plot_embeddings, tsne_2d
from pflkit.fl.federation import federation_for
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.runner import make_env

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
exp = session.resolve("pfedhn_fig4_embeddings")
if exp.data.scheme != "domains":
    # the digits stand-in has no alphabets: each client holds a single digit, and the digit is its group
    exp = session.resolve("pfedhn_fig4_embeddings", "data.scheme=pathological",
                          "data.partition={ classes_per_client = 1 }")
data_label = session.dataset_label(exp)
dataset = session.load(exp.data.dataset, **exp.data.options)
fed = federation_for(exp.data, dataset, exp.seed)
if exp.data.scheme == "domains":
    groups = fed.group_of_clients("alphabet")
    names = dataset.meta.group_names["alphabet"]
else:
    groups, names = fed.histograms().argmax(1), dataset.meta.class_names
print(f"{data_label}: {fed.num_clients} clients; clients per group:", np.bincount(groups))

# %%
env = make_env(exp, fed, seed)
# the batch's run of this experiment, when it kept pFedHN's trained states (same settings and data), else here
res = session.trained(exp, "pFedHN", fed, env, dataset, results_root)
emb = embeddings(res.state).detach().cpu().numpy()
report = embedding_report(emb, groups)
print(f"pFedHN on {data_label}: mean test accuracy {100 * res.summary['acc']:.2f}% (embedding dim {emb.shape[1]})")
print(f"nearest-neighbour group agreement {report['neighbour_agreement']:.2f} (chance {report['chance']:.2f}), "
      f"silhouette {report['silhouette']:.2f}")

# %%
xy = tsne_2d(emb, seed=seed)
title = (f"t-SNE of pFedHN client embeddings, {data_label}\n1-NN same group {report['neighbour_agreement']:.2f} "
         f"(chance {report['chance']:.2f}), silhouette {report['silhouette']:.2f}")
ax = plot_embeddings(xy, groups, names, title=title)
save_figure(ax.figure, session.figure("embeddings_tsne.png"))
plt.show()
