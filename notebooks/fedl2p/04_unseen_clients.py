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
# # FedL2P Table 4: clients never seen in training
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/04_unseen_clients.ipynb)
#
# Speech Commands is naturally partitioned by speaker (sec. 4.3). FedL2P pretrains the model and learns its
# meta-nets on a *seen* pool of speakers only; an *unseen* pool never takes part. Because the meta-nets map a
# client's data statistics to its hyperparameters, an unseen client still gets its own beta and eta from one
# forward pass, and is then fine-tuned and tested like the others (Table 4: FedL2P's gain holds on both pools,
# while fine-tuning with the pretrained BN statistics, BN G, fails on new speakers).
#
# Offline, the Free Spoken Digit Dataset plays this role: six speakers, one client each, four seen and two
# unseen (`pflkit/catalog/fedl2p/fedl2p_table4_fsdd_e5.toml`; the Speech Commands rows are
# `fedl2p_table4_speech_commands_e*`). The runner reports the unseen pool in
# `results["methods"][label]["unseen"]`; `acc_mean` is over the seen pool.
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
out_dir = "runs/fedl2p_unseen"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
seeds = 1
speech = "fsdd"  # fsdd, offline, or speech_commands
epochs = 5  # 5 or 15
results_root = None

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pflkit.notebooks import setup
from pflkit.report.fedl2p import client_info, load_report, versus_finetuning
from pflkit.report.figures import save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
name = f"fedl2p_table4_{speech}_e{epochs}"
cfg = session.resolve(name, f"seeds={seeds}")
print(name, "-", cfg.title, "|", session.dataset_label(cfg))

# %% [markdown]
# ## 1. Seen and unseen pools

# %%
results = session.run(name, f"seeds={seeds}", results_root=results_root)
run_dir = session.run_dir(name, results_root)
data_label, paper = session.dataset_label(results), session.paper_header(results)
published = results["config"]["published"]
rows = []
for label, m in results["methods"].items():
    unseen = (m.get("unseen") or {}).get("acc_mean")
    rows.append({"method": label, "seen": m["acc_mean"], f"{paper} seen": published.get(label),
                 "unseen": unseen, f"{paper} unseen": published.get(f"{label} (unseen)")})
table = pd.DataFrame(rows).set_index("method")
print(f"{name} on {data_label} - preset {preset}; mean over clients of per-client test accuracy (%)")
table.round(2)

# %%
print("seen:  ", versus_finetuning(results))
print("unseen:", versus_finetuning(results, pool="unseen"))
fig, ax = plt.subplots(figsize=(7, 3.2))
x = np.arange(len(table))
ax.bar(x - 0.2, table["seen"], 0.4, label="seen")
ax.bar(x + 0.2, table["unseen"].astype(float), 0.4, label="unseen")
ax.set_xticks(x, table.index, rotation=20)
ax.set_ylabel("accuracy (%)")
ax.set_title(f"{name}: {data_label}")
ax.legend()
save_figure(fig, session.figure(f"{name}_pools.png"))
plt.show()

# %% [markdown]
# ## 2. The hyperparameters of unseen clients
# The report covers every client, seen or not: unseen clients get beta and eta from the meta-nets learned on
# the seen ones. The paper finds a mix of pretrained and client BN statistics for new speakers (App. F).

# %%
report = load_report(run_dir, "FedL2P", seed)
pools = [c.get("pool", "seen") for c in client_info(run_dir, seed)]
frame = pd.DataFrame([{"client": r["client"], "pool": p, "mean beta": np.mean(list(r["beta"].values())),
                       "sparsity": r["sparsity"]} for r, p in zip(report, pools)])
frame.round(3)

# %% [markdown]
# ## What these numbers mean
# The paper's claims that pflkit checks (`pflkit.report.claims`), evaluated on this notebook's runs at this
# preset. The paragraph is written from the verdicts, so it always says what these runs show.

# %%
claims, meaning = session.claims("fedl2p", [name], results_root)
print(meaning)
claims
