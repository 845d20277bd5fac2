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
# Every row is a file in `pflkit/catalog/fedl2p/` (`fedl2p_table2_a0p1_e5`, `fedl2p_table1_fedbabu_a0p5`, ...);
# from a shell: `pflkit run fedl2p_table2_a0p1_e5 --preset cpu --data-root ~/data --out runs/t2_a0p1_e5`.
# Set `results_root` to a folder of such runs (`<results_root>/<experiment>/results.json`) to render them
# without retraining; otherwise this notebook runs the row given by `alpha` and `epochs`.
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
out_dir = "runs/fedl2p_label_shift"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
seeds = 1
alpha = "0p1"  # one of 1000, 1p0, 0p5, 0p1
epochs = 5  # 5 or 15
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pflkit.io import read_json
from pflkit.notebooks import setup
from pflkit.report.fedl2p import beta_summary, load_report, plot_hyperparameters, versus_finetuning
from pflkit.report.figures import plot_methods, save_figure
from pflkit.report.tables import compare_table

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
name = f"fedl2p_table2_a{alpha}_e{epochs}"
print(name, "|", session.dataset_label(session.resolve(name)))

# %% [markdown]
# ## 1. One row of Table 2
# Methods run in order: FedAvg pretraining ("Global": the global model tested on every client), the three
# FT baselines, L2P and FedL2P. Accuracy is the mean over clients of each client's test accuracy.

# %%
results = session.run(name, f"seeds={seeds}", results_root=results_root)
run_dir = session.run_dir(name, results_root)
data_label = session.dataset_label(results)
print(session.format_table(results))
print("FedL2P vs the best FT baseline:", versus_finetuning(results))

# %%
ax = plot_methods(results)
ax.set_title(f"{name}: {data_label}")
save_figure(ax.figure, session.figure(f"{name}_methods.png"))
plt.show()

# %% [markdown]
# ## 2. What FedL2P learned (Fig. 2a)
# beta per BN layer across clients (0 = the pretrained statistics), eta per tensor and the sparsity (share of
# parameters with eta = 0). With the cpu preset's 20 meta rounds beta has less time to travel than in the
# paper's 500.

# %%
report = load_report(run_dir, "FedL2P", seed)
print(beta_summary(report))
fig = plot_hyperparameters(report, f"{name} ({data_label}): FedL2P's hyperparameters (preset {preset})")
save_figure(fig, session.figure(f"{name}_hyperparameters.png"))
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
        rows.append({"experiment": c["name"], "dataset": session.dataset_label(res), "method": label,
                     "ours": m["acc_mean"], session.paper_header(res): m["published"]})
values = ["ours", *sorted({k for r in rows for k in r if k.startswith("paper")})]
table = pd.DataFrame(rows).pivot_table(index=["experiment", "dataset", "method"], values=values, aggfunc="first")
table.round(2)

# %%
by_alpha = [r for r in runs if r["config"]["table"] == "Table 2"]
if len(by_alpha) > 1:
    print(compare_table(by_alpha, "data.partition.alpha").round(2))

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("fedl2p", [name, *(p.parent.name for p in found)], results_root)
print(meaning)
claims
