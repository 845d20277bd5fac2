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
# # pFedHN Tables 1 and 2: heterogeneous data and computational budgets
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/02_tables.ipynb)
#
# **Table 1** (sec. 5.1): CIFAR-10 split among 10 and 50 clients with pFedMe's pathological protocol (2 classes
# per client, shares U(.4, .6)), the LeNet target, and every method of the paper: Local, FedAvg, Per-FedAvg (both
# meta-gradients), FedPer, pFedMe, LG-FedAvg (started from the FedAvg model), pFedHN and pFedHN-PC. Accuracy is
# the mean over clients of each client's test accuracy, at the state with the best validation accuracy.
#
# **Table 2** (sec. 5.2): 75 clients in three groups whose LeNets have 8 / 16 / 32 first-layer filters. One
# hypernetwork serves all three sizes; the baselines, which cannot share across sizes, are trained per group.
#
# Each experiment is a file in `pflkit/catalog/pfedhn/`; the same runs from a shell:
# `pflkit run pfedhn_table1_c10_n50 --preset cpu --out runs/c10_n50` (data from `--data-root` or `$PFLKIT_DATA`).
# Point `results_root` at a folder of such runs (`<results_root>/<experiment>/results.json`) to render them
# here without retraining.
#
# **Data and device.** CIFAR-10 is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); when none of these works the notebook stops with an error naming it. `standin=True`
# runs sklearn's digits instead (with a small CNN; MLP widths for the budgets), and every title, table and
# printout then names the stand-in. `device="auto"` uses a GPU when there is one.
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
out_dir = "runs/pfedhn_tables"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
results_root = None

# %%
import pandas as pd

from pflkit.notebooks import setup
from pflkit.report.pfedhn import budget_table

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
# at smoke, skip validation passes: the point is that every method runs end to end
quick = ["methods.*.eval_every=0", "pretrain.eval_every=0"] if preset == "smoke" else []

# %% [markdown]
# ## Table 1: CIFAR-10, 10 and 50 clients
# With `results_root` set, a finished run `<results_root>/<experiment>/results.json` is read instead of trained.

# %%
names = ["pfedhn_table1_c10_n10"] if preset == "smoke" else ["pfedhn_table1_c10_n10", "pfedhn_table1_c10_n50"]
table1 = {name: session.run(name, *quick, results_root=results_root) for name in names}

# %%
rows = {}
for name, res in table1.items():
    n = res["config"]["data"]["num_clients"]
    for label, m in res["methods"].items():
        rows.setdefault(label, {})[(f"{n} clients", "ours")] = m["acc_mean"] if m["status"] == "ok" else None
        rows[label][(f"{n} clients", session.paper_header(res))] = m["published"]
        rows[label][(f"{n} clients", "KiB/round")] = m["bytes_per_round"] / 2**10
t1 = pd.DataFrame.from_dict(rows, orient="index")
t1.columns = pd.MultiIndex.from_tuples(t1.columns)
for name, res in table1.items():  # a method that did not finish (e.g. diverged) has no number in the table
    failed = {label: m["status"] for label, m in res["methods"].items() if m["status"] != "ok"}
    print(f"{name}:", failed or "every method finished")
print(f"Table 1 on {session.dataset_label(res)}, preset {preset}: test accuracy (%), mean over clients")
t1.round(2)

# %% [markdown]
# ## Table 2: computational budgets S / M / L
# One experiment file holds the whole table: pFedHN, one run over all 75 clients, and each baseline declared
# once per group (`clients = { group = g, of = 3 }`, `model = { width = w }`; LG-FedAvg `start_from` its
# group's FedAvg), which the runner trains on that group's 25 clients, 5 per round, with the Table 1 settings
# (App. B: "the same hyperparameters selected in Section 5.1"). The table below is a function of its
# `results.json` (`pflkit.report.pfedhn.budget_table`): pFedHN's group accuracies are means of its per-client
# accuracies, each baseline's cell its own mean over its group. The budgets are LeNet widths 8 / 16 / 32; on
# the sklearn digits stand-in (`standin=True`: 8x8 images, too small for a LeNet) they are 8 / 16 / 32 hidden
# units of an MLP.

# %%
res2 = session.run("pfedhn_table2_budget_c10", *quick[:1], results_root=results_root)  # no pretraining stage
failed = {label: m["status"] for label, m in res2["methods"].items() if m["status"] != "ok"}
print("pfedhn_table2_budget_c10:", failed or "every method finished")
print(f"Table 2 on {session.dataset_label(res2)}, preset {preset}: test accuracy (%) per budget group "
      "(Per-FedAvg: the paper does not say which variant)")
budget_table(res2, paper_header=session.paper_header(res2)).round(2)

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("pfedhn", names, results_root)
print(meaning)
claims
