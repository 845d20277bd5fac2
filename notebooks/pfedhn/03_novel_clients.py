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
# # pFedHN Fig. 2 / 7: generalization to novel clients
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/03_novel_clients.ipynb)
#
# Sec. 5.3: CIFAR-10 is split among 100 clients by a per-class Dirichlet draw (p_i ~ Dir(alpha), normalized
# over clients). pFedHN trains on 90 of them (alpha = 0.1). The other 10 are *novel*, drawn with alpha in
# {.1, .25, .5, 1}: the larger alpha, the further a novel client's label distribution is from every training
# client. For a novel client we **freeze the hypernetwork** and optimize only its embedding on its own data, with
# the update of training (Alg. 1 restricted to v_new), until the embedding stops moving (`novel_fit="converge"`;
# `novel_fit="rounds"` is the older, much smaller budget of Alg. 1 rounds). The x-axis is the total variation
# distance to the nearest training client, computed as in the paper over p_hat (each client's share of every
# class's samples, normalized over all 100 clients; `tv_basis="labels"` uses label distributions instead); the
# y-axis the accuracy gap acc_novel - acc_train (Fig. 2) or each novel client's accuracy (Fig. 7).
#
# **Data and device.** CIFAR-10 is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); when none of these works the notebook stops with an error naming it. `standin=True`
# runs sklearn's digits instead (with a small CNN), and every title, table and printout then names the stand-in.
# `device="auto"` uses a GPU when there is one; figures go to `figures_dir` (default `out_dir/figures`).
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
out_dir = "runs/pfedhn_novel"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
novel_fit = None  # None: the experiment's, converge; "rounds": the older fixed budget
# novel_steps: converge: most updates per client (None: 10 at smoke, 100 at cpu, else the config's 1000);
# rounds: rounds in all (None: 10 per novel client)
novel_steps = None
tv_basis = "p_hat"  # "p_hat", the paper's, or "labels"

# %%
import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pflkit.analysis.pfedhn import novel_tv
from pflkit.fl.federation import federation_for
from pflkit.fl.loop import summarize
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.runner import make_env
from pflkit.stages import fit_novel_clients, method_config, train_method

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
exp = session.resolve("pfedhn_fig2_novel")
data_label = session.dataset_label(exp)
alphas = np.asarray(exp.data.partition["alpha"])
num_novel = max(3, len(alphas) // 10)  # the last 10 of 100 clients (smoke: 3 of 10) are novel
fed = federation_for(exp.data, session.load(exp.data.dataset, **exp.data.options), exp.seed)
n = fed.num_clients
train_fed, novel_fed = fed.subset(range(n - num_novel)), fed.subset(range(n - num_novel, n))
print(f"{data_label}: {n - num_novel} training clients (alpha {alphas[0]}), {num_novel} novel clients, "
      f"alpha {alphas[n - num_novel:]}")

# %% [markdown]
# ## 1. Train pFedHN on the training clients

# %%
env = make_env(exp, train_fed, seed)
trained = train_method(exp, "pFedHN", train_fed, env)
acc_train = summarize(trained.per_client)["acc"]
print(f"{data_label}, training clients: mean test accuracy {100 * acc_train:.2f}%")

# %% [markdown]
# ## 2. Novel clients: phi frozen, one new embedding each
# The new embeddings start at the mean of the trained ones. Each is optimized on its own client's data until the
# mean of its last `novel_window` iterates moves by less than `novel_tol` (relative), or `novel_max_steps` updates
# (1000 by default; this notebook caps it at 10 at smoke and 100 at cpu, where one update is K = 50 local steps,
# about 1.5 s on a CPU core; the `converged` column says whether the stop rule fired before the cap).

# %%
_, cfg = method_config(exp, "pFedHN")
if novel_fit is not None:
    cfg = dataclasses.replace(cfg, novel_fit=novel_fit)
if novel_steps is None and cfg.novel_fit == "converge" and preset in ("smoke", "cpu"):
    novel_steps = {"smoke": 10, "cpu": 100}[preset]  # a budget cap: the table's `converged` says whether it bound
if novel_steps is not None:
    key = "novel_max_steps" if cfg.novel_fit == "converge" else "novel_rounds"
    cfg = dataclasses.replace(cfg, **{key: novel_steps})
novel = fit_novel_clients(trained, novel_fed, cfg, make_env(exp, novel_fed, seed))
tv, nearest = novel_tv(train_fed, novel_fed, basis=tv_basis)
acc_novel = np.array([novel.per_client[j]["acc"] for j in range(num_novel)])
table = pd.DataFrame({"alpha": alphas[n - num_novel:], f"TV to nearest ({tv_basis})": tv,
                      "nearest training client": nearest, "accuracy (%)": 100 * acc_novel,
                      "gap (%)": 100 * (acc_novel - acc_train)})
if cfg.novel_fit == "converge":
    table["updates"] = [h["steps"] for h in novel.history]
    table["converged"] = [h["converged"] for h in novel.history]
print(f"generalization gap acc_novel - acc_train = {100 * (acc_novel.mean() - acc_train):.2f} points "
      f"(novel_fit={cfg.novel_fit})")
table.round(3)

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
by_alpha = table.groupby("alpha").mean(numeric_only=True)
ax[0].plot(by_alpha[f"TV to nearest ({tv_basis})"], by_alpha["gap (%)"], marker="o", label="pFedHN")
for a, row in by_alpha.iterrows():
    ax[0].annotate(f"alpha={a:g}", (row[f"TV to nearest ({tv_basis})"], row["gap (%)"]), fontsize=8)
ax[0].axhline(0, color="k", lw=0.5)
ax[0].set_xlabel(f"total variation to the nearest training client ({tv_basis})")
ax[0].set_ylabel("acc_novel - acc_train (points)")
ax[0].set_title("Fig. 2: generalization gap")
ax[0].legend()
for a, rows in table.groupby("alpha"):
    ax[1].scatter(rows[f"TV to nearest ({tv_basis})"], rows["accuracy (%)"], label=f"alpha={a:g}")
ax[1].legend(fontsize=8, title="novel clients' alpha", title_fontsize=8)
ax[1].set_xlabel(f"total variation to the nearest training client ({tv_basis})")
ax[1].set_ylabel("novel client test accuracy (%)")
ax[1].set_title("Fig. 7: one point per novel client")
fig.suptitle(f"pFedHN on {data_label}, preset {preset}", fontsize=10)
fig.tight_layout()
save_figure(fig, session.figure("novel_clients.png"))
plt.show()
