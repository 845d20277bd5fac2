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
# unseen (`experiments/fedl2p/fedl2p_table4_fsdd_e5.toml`; the Speech Commands rows are
# `fedl2p_table4_speech_commands_e*`). The runner reports the unseen pool in
# `results["methods"][label]["unseen"]`; `acc_mean` is over the seen pool.

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
out_dir = "runs/fedl2p_unseen"
data_root = None
seed = 0
seeds = 1
source = "fsdd"  # fsdd (offline) or speech_commands
epochs = 5  # 5 or 15
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from pflkit.data.base import DatasetNotFoundError
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.io import read_json
from pflkit.report.fedl2p import client_info, load_report, versus_finetuning
from pflkit.report.figures import save_figure
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tiny models on a shared CPU: one thread avoids oversubscription
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/fedl2p")
shared = Path("../../../shared/data")
root = data_root or (str(shared) if shared.is_dir() else None)
name = f"fedl2p_table4_{source}_e{epochs}"
cfg = resolve(name, preset, [f"seed={seed}", f"seeds={seeds}"])
try:
    load_dataset(cfg.data.dataset, root, **cfg.data.options)
except DatasetNotFoundError:
    print(f"{cfg.data.dataset} not found: running the embedded digits demo with 2 unseen clients instead")
    name, cfg = "demo", resolve("demo", preset, [f"seed={seed}", "data.unseen_clients=2"])
print(name, "-", cfg.title)

# %% [markdown]
# ## 1. Seen and unseen pools

# %%
run_dir = Path(results_root) / name if results_root else out / name
if results_root and (run_dir / "results.json").exists():
    results = read_json(run_dir / "results.json")
else:
    results = run_experiment(cfg, run_dir, data_root=root, progress=False)
published = results["config"]["published"]
rows = []
for label, m in results["methods"].items():
    unseen = (m.get("unseen") or {}).get("acc_mean")
    rows.append({"method": label, "seen": m["acc_mean"], "paper seen": published.get(label),
                 "unseen": unseen, "paper unseen": published.get(f"{label} (unseen)")})
table = pd.DataFrame(rows).set_index("method")
print(f"{name} - preset {preset}; mean over clients of per-client test accuracy (%)")
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
ax.legend()
save_figure(fig, fig_dir / f"{name}_pools.png")
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
