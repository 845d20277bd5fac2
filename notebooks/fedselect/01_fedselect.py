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
# # FedSelect: choosing, parameter by parameter, what to personalize
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedselect/01_fedselect.ipynb)
#
# Partial personalization splits a model into **shared** parameters (averaged by the server) and
# **personal** ones (kept by each client). FedPer, FedRep and FedAlt fix the split by layer (the head).
# FedSelect (Tamirisa et al.) lets every client pick *individual entries* to personalize, with a
# lottery-ticket-style search, **GradLTN** (Alg. 1): train, keep as candidates the entries that moved most,
# freeze the rest at their starting values, rewind, repeat. The surviving entries become personal; the
# frozen ones are shared and averaged, entry by entry, only over the clients that share them (Alg. 2).
#
# This notebook:
# 1. runs GradLTN on a small model and shows which parameters move and how the mask evolves;
# 2. reproduces **Table 1** (CIFAR-10, 10 clients with s = 2 or 4 classes each) with every baseline,
#    our numbers beside the paper's, and the communication per round;
# 3. draws **Fig. 1** (overlap of the client masks in the final linear layer) and **Fig. 2**
#    (accuracy against the personalization rate p).
#
# Two readings of the mask schedule are compared. `FedSelect (p)` follows the paper's Alg. 1: every round,
# GradLTN searches a fresh mask, keeping the share p of the candidates per iteration, so about p^L of the
# entries end up personal (p = 0.5, L = 5: 3%). `FedSelect/code (p)` follows the authors' public code:
# the mask is kept across rounds and grows each round by the share p of the still-shared weights that moved
# most, up to 80% personal. The paper reports numbers for the first only.
#
# `preset`: `smoke` (seconds, what the tests run), `cpu` (the numbers of the README: a small LeNet trained
# from scratch on the offline CIFAR-10 subset, 30 rounds), `paper` (ImageNet-pretrained ResNet-18,
# 200 rounds: a GPU job). A preset changes sizes only, never the algorithm.
#
# **Data and device.** CIFAR-10 is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); when none of these works the notebook stops with an error naming it. `standin=True`
# runs sklearn's digits instead (with a small CNN) for Table 1 and the figures, and every title, table and
# printout then names the stand-in. `device="auto"` uses a GPU when there is one; figures go to `figures_dir`
# (default `out_dir/figures`).
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
out_dir = "runs/fedselect"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
results_root = None  # a folder of saved runs: <results_root>/<experiment>/, e.g. the work folder of pflkit reproduce

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from pflkit.algorithms import get_algorithm
from pflkit.algorithms.fedselect import grad_ltn
from pflkit.analysis.masks import client_masks, density, layer_density, pairwise_iou
from pflkit.fl.algorithm import Env
from pflkit.fl.federation import Federation, build_federation
from pflkit.io import read_json
from pflkit.models import build_model, head_param_names
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.report.tables import results_table
from pflkit.runner import final_states_path, load_final_states, make_env, run_experiment

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
SETTINGS = (2, 4)
# the digits stand-in keeps FedSelect's paired train / test shards, with fewer test samples per class
shards = ["data.split=paired", "data.partition.samples_per_class=[20, 8]"] if session.standin else []

# %% [markdown]
# ## 1. GradLTN on a small model
# One client of a small federation of handwritten digits (two digits per client), a small CNN, p = 0.5 and
# L = 5. Iteration 0 trains every entry; after each iteration the candidates are ranked by how far they
# moved, |theta_i - theta_0|, the top share p stays trainable and the rest is frozen (shared) for good.
# The candidate share therefore falls as p^i, and the entries that survive L iterations are personal.

# %%
digits = session.load("digits")
small = build_federation(digits, "shards", 4, seed=seed, split="paired", val_fraction=0.0,
                         classes_per_client=2, samples_per_class=(20, 10))
env = Env(model_fn=lambda: build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8)), seed=seed)  # tiny: on the CPU
env.seed_torch("init")
model = env.model_fn()
ltn_cfg = get_algorithm("fedselect").make_config({
    "personalization_rate": 0.5, "ltn_iterations": 5, "ltn_epochs": 1 if preset == "smoke" else 5,
    "lr": 0.05, "momentum": 0.9, "batch_size": 10})
ltn = grad_ltn(model, small.clients[0], ltn_cfg, env, keep_trace=True)
shares = [density(mask) for mask, _ in ltn.trace]
print("candidate share per iteration:", np.round(shares, 4))
print("personal share per layer:", {k: round(v, 3) for k, v in layer_density(ltn.mask).items()})

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
i = np.arange(len(shares))
axes[0].bar(i, shares, color="tab:orange", label="candidates (become personal)")
axes[0].plot(i, 0.5 ** i, "k.--", label="p^i")
axes[0].set_xlabel("GradLTN iteration i")
axes[0].set_ylabel("share of entries")
axes[0].set_yscale("log")
axes[0].legend(fontsize=8)
mask1, delta1 = ltn.trace[1]
moved = np.concatenate([delta1[n].flatten().numpy() for n in delta1])
kept = np.concatenate([mask1[n].flatten().numpy() for n in mask1])
bins = np.logspace(np.log10(max(moved[moved > 0].min(), 1e-8)), np.log10(moved.max()), 40)
axes[1].hist(moved[kept], bins=bins, alpha=0.7, label="stay candidates")
axes[1].hist(moved[~kept], bins=bins, alpha=0.7, label="frozen (shared)")
axes[1].set_xscale("log")
axes[1].set_xlabel("|theta_1 - theta_0| after iteration 0")
axes[1].legend(fontsize=8)
axes[1].set_title("which parameters move")
save_figure(fig, session.figure("gradltn_schedule.png"))
plt.show()

# %%
per_layer = pd.DataFrame({f"m_{k}": layer_density(mask) for k, (mask, _) in enumerate(ltn.trace)})
fig, ax = plt.subplots(figsize=(7, 0.35 * len(per_layer) + 1))
sns.heatmap(per_layer, annot=True, fmt=".2f", cmap="magma", vmin=0, vmax=1, ax=ax, cbar=False)
ax.set_title("share of each tensor still a candidate, iteration by iteration (m_L = personal)", fontsize=10)
save_figure(fig, session.figure("gradltn_layer_masks.png"))
plt.show()

# %% [markdown]
# ## 2. Table 1: every method on CIFAR-10, s = 2 and s = 4
# `run_experiment` trains every row of `pflkit/catalog/fedselect/fedselect_table1_s{2,4}.toml` (FedAvg first: its
# global model is the FedAvg row and LG-FedAvg's start) and tests each client's final model on its own test
# split. `resume=True` reuses any stage already finished in `out_dir` (the `cpu` preset takes a while); a run of
# this preset under `results_root` that kept FedSelect (0.50)'s trained states (Fig. 1 reads them) is read instead.
# MB/round counts what really travels: FedSelect sends only its shared entries (and its mask as bits).
#
# Every method makes 5 passes over its client's data per round (sec. 3: "we fix the number of local epochs
# across all methods to 5"): FedRep 4 head epochs then 1 body epoch, LocalAlt (FedSelect, FedAlt) 5 passes
# alternating personal / shared. FedRep and LG-FedAvg use their authors' learning rate, momentum and batch size.

# %%
results, run_dirs = {}, {}
for s in SETTINGS:
    name = f"fedselect_table1_s{s}"
    saved = session.run_dir(name, results_root)
    if not shards and saved != session.out / name and final_states_path(saved, "FedSelect (0.50)", seed).exists():
        print(f"{name}: results read from {saved}")
        results[s], run_dirs[s] = read_json(saved / "results.json"), saved
        continue
    cfg, run_dirs[s] = session.resolve(name, *shards), session.out / f"s{s}"
    results[s] = run_experiment(cfg, run_dirs[s], data_root=session.data_root, download=session.download,
                                resume=True, progress=False, keep_states=True)
data_label, paper = session.dataset_label(results[2]), session.paper_header(results[2])
for s in SETTINGS:
    failed = {label: m["status"] for label, m in results[s]["methods"].items() if m["status"] != "ok"}
    print(f"s = {s} on {data_label}:", failed or "every method finished")

# %%
def personal_share(res, label):
    hist = next(iter(res["rounds"][label].values()))
    return hist[-1].get("client_personal_share", np.nan) if hist else np.nan


frames = []
for s in SETTINGS:
    df = results_table(results[s]).set_index("method")
    df["personal %"] = [100 * personal_share(results[s], m) for m in df.index]
    frames.append(df[["acc_mean", "paper", "MB/round", "personal %"]].rename(
        columns={"acc_mean": f"ours s={s}", "paper": f"{paper} s={s}", "MB/round": f"MB/round s={s}",
                 "personal %": f"personal % s={s}"}))
table1 = pd.concat(frames, axis=1).round(2)
print(f"Table 1 on {data_label}, preset {preset}: test accuracy (%), mean over clients")
table1

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 0.3 * len(table1) + 1.5), sharey=True)
order = table1.index[::-1]
for s, color in zip(SETTINGS, ("tab:blue", "tab:orange")):
    axes[0].barh(np.arange(len(order)) + (0.2 if s == SETTINGS[0] else -0.2), table1.loc[order, f"ours s={s}"],
                 height=0.4, color=color, label=f"s = {s}")
axes[1].barh(np.arange(len(order)), table1.loc[order, f"MB/round s={SETTINGS[0]}"], color="tab:gray")
axes[0].set_yticks(np.arange(len(order)), order)
axes[0].set_xlabel("accuracy (%)")
axes[0].legend(fontsize=8)
axes[1].set_xlabel("MB per round (down + up, all clients)")
fig.suptitle(f"accuracy and communication - {data_label}, preset {preset}", fontsize=10)
save_figure(fig, session.figure("accuracy_vs_communication.png"))
plt.show()

# %% [markdown]
# The paper's claim at s = 2: FedSelect is above FedAvg, FedPer and FedBABU.

# %%
acc = {label: m["acc_mean"] for label, m in results[2]["methods"].items()}
for label in [k for k in acc if k.startswith("FedSelect")]:
    beaten = {b: acc[label] > acc[b] for b in ("FedAvg", "FedPer", "FedBABU")}
    print(f"{label:18s} {acc[label]:6.2f}", "above" if all(beaten.values()) else "NOT above all of", beaten)

# %% [markdown]
# ## 3. Fig. 1: how different are the clients' masks?
# Intersection over union of every pair of client masks in the final linear layer, FedSelect with p = 0.5
# (its Table 1 row's trained client states, which the run above kept: `keep_states=True`).

# %%
fig, axes = plt.subplots(1, len(SETTINGS), figsize=(5.5 * len(SETTINGS) + 1, 5.2), layout="constrained")
for ax, s in zip(np.atleast_1d(axes), SETTINGS):
    cfg = session.resolve(f"fedselect_table1_s{s}", *shards)
    kept = load_final_states(run_dirs[s], "FedSelect (0.50)", seed)
    masks = client_masks(kept["client_states"])
    fed = Federation.load(run_dirs[s] / f"seed{seed}" / "federation.npz",
                          session.load(cfg.data.dataset, **cfg.data.options))
    head = head_param_names(make_env(cfg, fed, seed).model_fn())
    iou = pairwise_iou([masks[c] for c in sorted(masks)], names=head)
    sns.heatmap(iou, vmin=0, vmax=1, cmap="viridis", annot=len(iou) <= 10, fmt=".2f", ax=ax, square=True,
                annot_kws={"size": 7}, cbar=False)
    share = np.mean([density(masks[c], head) for c in masks])
    ax.set_title(f"s = {s}: IoU of head masks\n({share:.1%} of entries personal on average)", fontsize=10)
    ax.set_xlabel("client")
    ax.set_ylabel("client")
fig.colorbar(plt.cm.ScalarMappable(norm=plt.Normalize(0, 1), cmap="viridis"), ax=axes, shrink=0.8,
             label="IoU of two clients' personal masks")
fig.suptitle(f"Fig. 1 on {data_label}, preset {preset}", fontsize=10)
save_figure(fig, session.figure("fig1_mask_iou.png"))
plt.show()

# %% [markdown]
# ## 4. Fig. 2: accuracy against the personalization rate p
# Larger p keeps more candidates per GradLTN iteration: more personal entries, fewer shared ones, less
# communication.

# %%
ps = (0.25, 0.5, 0.75)
fig, axes = plt.subplots(1, len(SETTINGS), figsize=(5 * len(SETTINGS), 3.4))
for ax, s in zip(np.atleast_1d(axes), SETTINGS):
    rows = [results[s]["methods"][f"FedSelect ({p:.2f})"] for p in ps]
    code = [results[s]["methods"][f"FedSelect/code ({p:.2f})"] for p in ps]
    ax.plot(ps, [r["acc_mean"] for r in rows], "o-", label=f"Alg. 1, pflkit ({preset})")
    ax.plot(ps, [r["acc_mean"] for r in code], "s:", label=f"authors' code schedule, pflkit ({preset})")
    ax.plot(ps, [r["published"] for r in rows], "k^--", label=paper)
    ax.set_xticks(ps)
    ax.set_xlabel("personalization rate p")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"s = {s}, {data_label}", fontsize=10)
    ax.legend(fontsize=8)
save_figure(fig, session.figure("fig2_accuracy_vs_p.png"))
plt.show()

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("fedselect", made={f"fedselect_table1_s{s}": (r, run_dirs[s])
                                                          for s, r in results.items()})
print(meaning)
claims
