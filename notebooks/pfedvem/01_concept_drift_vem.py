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
# # pFedVEM: label concept drift and variational EM
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedvem/01_concept_drift_vem.ipynb)
#
# Zhu, Ma and Blaschko (FL-NeurIPS'22) study **label concept drift**: every client has the same label
# distribution P_j(y), but the same label looks different from client to client (P_j(x | y) differs,
# Definition 2.1). They model each client's classifier w_j as drawn around a global w,
# p(w_j | w) = N(w, rho_j^2 I), and fit it with **variational EM** (pFedVEM, Alg. 1):
#
# 1. every client keeps a Gaussian q_j(w_j) = N(mu_j, Sigma_j) over its linear classifier and
#    maximizes its ELBO term E_q[log p(D_j | w_j)] - KL[q_j || N(w, rho_j^2 I)] (Eq. 5);
# 2. it estimates its own spread rho_j^2 = (Tr Sigma_j + ||mu_j - w||^2) / D (Eq. 7);
# 3. the server sets w to the **precision-weighted** mean of the reported mu_j, with tau_j = 1 / rho_j^2.
#
# The representation network below the classifier is shared and averaged (FedAvg), as in FedPer.
# pFedMAP is the point-estimate version with one fixed rho (a Ditto-like proximal head).
#
# Offline, the paper's CIFAR-100 superclass task is played by **Omniglot**: the 8 alphabets are the labels, and
# each client sees every alphabet through one random character of it. `preset` sets the size: `smoke` (seconds),
# `cpu` (the numbers of our note), `paper` (100 rounds, 5 seeds). Omniglot is read from `data_root` or
# `$PFLKIT_DATA`, or downloaded with `download=True` (see `data/README.md`); when none of these works the
# notebook stops with an error naming it. `standin=True` runs sklearn's digits instead, split with Dirichlet
# label shift (so no concept drift), and every title and table says so. `device="auto"` uses a GPU when there is
# one.
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
out_dir = "runs/pfedvem"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
experiment = "pfedvem_omniglot_n50"
results_root = None

# %%
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
import torch

from pflkit.data.partition import concept_drift_choices
from pflkit.experiments import resolve
from pflkit.fl.federation import federation_for
from pflkit.io import read_json
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.report.pfedvem import table1, trust_frame

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
cfg = session.resolve(experiment)
data_label = session.dataset_label(cfg)
dataset = session.load(cfg.data.dataset, **cfg.data.options)
print(f"{cfg.name} on {data_label} | partition {cfg.data.scheme} | preset {preset} | seeds {cfg.seeds}")

# %% [markdown]
# ## 1. Concept drift on images: the same label, different looks
# `concept_drift` follows the authors' split: clients come in groups of 5 that hold distinct characters
# (subclasses) of every alphabet (superclass), and each group takes one random count per alphabet, so
# every client holds the same number of samples of every label and client sizes vary. Each row below
# is a client, each column a label: look down a column to see one label drawn with a different
# character on every client.

# %%
d = cfg.data
fed = federation_for(d, dataset, seed)
labels = fed.meta.class_names
show = min(5, fed.num_clients)
fig, axes = plt.subplots(show, len(labels), figsize=(1.1 * len(labels), 1.15 * show), squeeze=False)
for i in range(show):
    x, y = fed.clients[i].tensors("train")
    for k in range(len(labels)):
        ax = axes[i, k]
        ax.imshow(x[y == k][0, 0] if (y == k).any() else np.zeros(x.shape[2:]), cmap="gray_r")
        ax.set_xticks([]), ax.set_yticks([])
        axes[0, k].set_title(labels[k][:12], fontsize=7)
    axes[i, 0].set_ylabel(f"client {i}", fontsize=8)
fig.suptitle(f"one training image per label and client ({data_label})")
save_figure(fig, session.figure("concept_drift_images.png"))
plt.show()

# %% [markdown]
# The label marginals are equal (every client holds the same number of samples of every label before
# the train / test holdout), the conditionals differ (different subclasses):

# %%
everything = [np.concatenate([c.splits[s] for s in ("train", "val", "test")]) for c in fed.clients]
marginals = np.stack([np.bincount(fed.y[i].numpy(), minlength=fed.num_classes) / len(i) for i in everything])
print("P_j(y) equal on every client:", np.allclose(marginals, marginals[0]))
if d.scheme == "concept_drift":
    fine = torch.cat([dataset.y_train, dataset.y_test]).numpy()
    choices = concept_drift_choices(fine, d.num_clients, superclass=np.asarray(dataset.meta.superclass), seed=seed,
                                    **d.partition)
    print("clients with distinct subclasses:", len(np.unique(choices, axis=0)), "of", d.num_clients)
    sizes = [c.num("train") for c in fed.clients]
    print(f"train samples per client: mean {np.mean(sizes):.1f}, min {min(sizes)}, max {max(sizes)}")
    display(pd.DataFrame(np.asarray(dataset.meta.class_names)[choices[:show]], columns=labels,
                         index=[f"client {i}" for i in range(show)]))
else:  # the stand-in has no subclasses to draw from: its clients differ in P_j(y) (label shift) instead
    print(f"{data_label} is split by {d.scheme!r}, not by concept drift")

# %% [markdown]
# ## 2. Variational EM: which clients does the server trust?
# The experiment's run (`pflkit run EXPERIMENT --preset PRESET`, made here unless `results_root` holds it:
# `<results_root>/<experiment>/results.json`) trains every method of the table, each seed on its own
# federation. pFedVEM's run also writes its client side of Alg. 1 (`seed<S>/pfedvem.report.json`), which we
# read for the run's first seed. The server
# weighs client j by tau_j = 1 / rho_j^2, and rho_j^2 has two parts (Eq. 7):
#
# * **Tr Sigma_j / D**, the client's own uncertainty about its classifier. Few samples leave the
#   posterior close to the prior (Sigma_j stays wide); many samples shrink it.
# * **||mu_j - w||^2 / D**, how far the client's classifier sits from the consensus. A client whose
#   concepts differ from the rest ends up far from w.
#
# So the server trusts clients that are **sure** (much data) and **typical** (close to w) more, and a
# small or unusual client pulls w less; on the client side, the same rho_j^2 sets the strength of the
# pull toward w (a client far from the consensus gets a weaker prior and personalizes more).
# Every client updates its q_j each round (the server broadcasts to all), but only about 10% report;
# every other method of the table runs under the same protocol (`participation = "broadcast"`).
# Predictions use each client's posterior mean head: for a linear head it is the mean logit, and it is
# deterministic (`predict = "mc"` averages the softmax over heads drawn from q_j instead).

# %%
res = session.run(experiment, results_root=results_root)
vem = next(label for label, m in res["methods"].items() if m["algorithm"] == "pfedvem")
# per client: n_j, rho_j^2 (Eq. 7 against the final w), its two parts, the share of tau_j in w, test accuracy
em = trust_frame(session.run_dir(experiment, results_root), res, vem)
print(f"{vem} on {data_label}, seed {res['config']['seed']}: {100 * em['test acc'].mean():.1f}% mean client "
      "test accuracy")
em.sort_values("rho2").round(5).head(10)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
sc = axes[0].scatter(em["n_train"], em["rho2"], c=em["||mu-w||^2/D"], cmap="viridis")
bar = fig.colorbar(sc, ax=axes[0], label="||mu_j - w||^2 / D")
# the values are small and close together: plain scientific ticks, no "+1e-5"-style offset above the axis
axes[0].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
bar.formatter = matplotlib.ticker.ScalarFormatter(useOffset=False)
bar.formatter.set_powerlimits((-3, 3))
bar.update_ticks()
axes[0].set_xlabel("client train samples n_j")
axes[0].set_ylabel("rho_j^2")
axes[0].set_title("each client's spread (Eq. 7)")
axes[1].bar(em.index, 100 * (em["trust tau_j (share)"] * len(em) - 1))
axes[1].axhline(0, color="k", lw=0.8)
axes[1].set_xlabel("client")
axes[1].set_ylabel("weight in w vs equal weights (%)")
axes[1].set_title("the server's trust tau_j")
save_figure(fig, session.figure("vem_client_trust.png"))
plt.show()

# %% [markdown]
# Reading the plot: which term of rho_j^2 wins depends on how much a client's data can say about its
# D head entries. Our Omniglot clients hold tens of training images (printed above) for
# D = 8 x 128 + 8 = 1032 head entries, so the data barely narrow q_j: Tr Sigma_j / D stays near its
# start (init_scale^2) and the distance term decides (clients with more images move their head further
# from w and get a larger rho_j^2). The EM learns little client-specific trust from so few samples;
# the paper's clients hold 250-1000 images for D = 20 x 100 + 20 = 2020, where the uncertainty term
# shrinks with n_j as well.

# %% [markdown]
# ## 3. Table 1
# Every method of the experiment on the same clients, each seed with its own federation (the partition
# is seeded); personalized accuracy = mean over clients of each client's test accuracy; mean and
# standard error over seeds (SEM, as in the paper), with the standard deviation (SD) beside it. The table is
# a function of the run's `results.json` (`pflkit.report.pfedvem.table1`), the run made (or read) above.
# Offline we run the Omniglot stand-in; the paper's CIFAR-100 / SUN397 numbers follow for reference
# (the `pfedvem_table1_*` experiments reproduce them where those datasets are available).

# %%
table = table1(res)
table.to_csv(session.out / "table1_ours.csv")
print(f"{cfg.name} on {data_label}, preset {preset}: personalized accuracy (%)")
table.round(2)

# %%
# a method with a seed that did not finish (status diverged / incomplete) is drawn grey and hatched, and its
# label says how many seeds its bar averages: never shown as if it had finished
partial = table["status"] != "ok"
names = [f"{m}\n({row.seeds} of {row.of} seeds;\n{row.status})" if bad else m
         for (m, row), bad in zip(table.iterrows(), partial)]
fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(table), 3.4))
ax.bar(names, table["ours (%)"], yerr=table["SEM"].fillna(0), capsize=3,
       color=["tab:gray" if bad else "tab:blue" for bad in partial], hatch=[("//" if bad else "") for bad in partial])
ax.set_ylabel("personalized accuracy (%)")
ax.set_title(f"{cfg.name} on {data_label} - preset {preset}", fontsize=10)
ax.tick_params(axis="x", rotation=20)
save_figure(fig, session.figure("table1_ours.png"))
plt.show()

# %%
print("published personalized accuracy (%), the paper's own datasets, for reference; beside it ours, where "
      f"a saved run of that experiment at preset {preset} is found (`results_root`)")
paper = {}
for ds_name, ns in (("cifar100", (50, 100, 200)), ("sun397", (50, 100, 200))):
    for n in ns:
        name = f"pfedvem_table1_{ds_name}_n{n}"
        paper[(f"{ds_name} {n}", "paper")] = resolve(name, "paper").published
        saved = session.run_dir(name, results_root) / "results.json"
        if saved.exists():
            paper[(f"{ds_name} {n}", "ours")] = table1(read_json(saved))["ours (%)"].to_dict()
pd.DataFrame(paper).reindex(["Local", "FedAvg", "pFedME", "pFedPer", "pFedHN", "pFedMAP", "pFedVEM"])

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("pfedvem", [experiment], results_root)
print(meaning)
claims
