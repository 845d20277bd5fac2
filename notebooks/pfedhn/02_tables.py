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
# Each experiment is a file in `experiments/pfedhn/`; the same runs from a shell:
# `pflkit run pfedhn_table1_c10_n50 --preset cpu --data-root ../shared/data --out runs/c10_n50`.
# Point `results_root` at a folder of such runs (`<results_root>/<experiment>/results.json`) to render them
# here without retraining.

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
out_dir = "runs/pfedhn_tables"
data_root = None
seed = 0
results_root = None

# %%
from pathlib import Path

import pandas as pd
import torch

from pflkit.algorithms.pfedhn import budget_group
from pflkit.analysis.pfedhn import experiment_federation, group_accuracy, subfederation, train_method
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.fl.train import set_state
from pflkit.io import read_json
from pflkit.report.tables import format_table
from pflkit.runner import initial_model, make_env, run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tests run many notebooks side by side on few cores
root = data_root or ("../../../shared/data" if Path("../../../shared/data").is_dir() else None)
out = Path(out_dir)
# offline without the CIFAR-10 files (fresh Colab / CI): the embedded digits and a small MLP instead
fallback = [] if root else ["data.dataset=digits", "model.name=mlp", "model.options={}"]
# at smoke, skip validation passes: the point is that every method runs end to end
quick = ["methods.*.eval_every=0", "pretrain.eval_every=0"] if preset == "smoke" else []
overrides = [f"seed={seed}"] + fallback + quick

# %% [markdown]
# ## Table 1: CIFAR-10, 10 and 50 clients

# %%
names = ["pfedhn_table1_c10_n10"] if preset == "smoke" else ["pfedhn_table1_c10_n10", "pfedhn_table1_c10_n50"]
table1 = {}
for name in names:
    saved = Path(results_root) / name / "results.json" if results_root else None
    if saved is not None and saved.exists() and read_json(saved)["config"]["preset"] == preset:
        table1[name] = read_json(saved)
    else:
        table1[name] = run_experiment(resolve(name, preset, overrides), out / name, data_root=root, progress=False)
    print(format_table(table1[name]), "\n")

# %%
rows = {}
for name, res in table1.items():
    n = res["config"]["data"]["num_clients"]
    for label, m in res["methods"].items():
        rows.setdefault(label, {})[(f"{n} clients", "ours")] = m["acc_mean"]
        rows[label][(f"{n} clients", "paper")] = m["published"]
        rows[label][(f"{n} clients", "KiB/round")] = m["bytes_per_round"] / 2**10
t1 = pd.DataFrame.from_dict(rows, orient="index")
t1.columns = pd.MultiIndex.from_tuples(t1.columns)
print(f"Table 1, preset {preset}: test accuracy (%), mean over clients")
t1.round(2)

# %% [markdown]
# ## Table 2: computational budgets S / M / L
# pFedHN: one run over all 75 clients. Baselines: each group on its own (25 clients, 5 per round), with the
# Table 1 settings (App. B: "the same hyperparameters selected in Section 5.1").

# %%
widths = {"S": 8, "M": 16, "L": 32}
if root is None:
    print("Table 2 needs CIFAR-10 images (LeNet of three widths); skipped offline without ../shared/data")
else:
    exp2 = resolve("pfedhn_table2_budget_c10", preset, [f"seed={seed}"] + quick[:1])
    dataset = load_dataset(exp2.data.dataset, root)
    fed2 = experiment_federation(exp2, dataset)
    env2 = make_env(exp2, fed2, seed)
    hn = train_method(exp2, "pFedHN", fed2, env2)
    n = fed2.num_clients
    table2 = {"pFedHN": group_accuracy([100 * hn.per_client[i]["acc"] for i in range(n)], 3)}
    base_name = "pfedhn_table1_c10_n50"
    for g, (size, width) in enumerate(widths.items()):
        ids = [i for i in range(n) if budget_group(i, n, 3) == g]
        sub = subfederation(fed2, ids)
        base = resolve(base_name, preset, [f"seed={seed}", f"model.options.width={width}"] + quick)
        env = make_env(base, sub, seed)
        frac = min(1.0, 5 / len(ids))
        fedavg = train_method(base, "FedAvg", sub, env, fraction=frac)
        runs = {"FedAvg": fedavg,
                "Per-FedAvg (HF)": train_method(base, "Per-FedAvg (HF)", sub, env, fraction=frac),
                "pFedMe": train_method(base, "pFedMe", sub, env, fraction=frac),
                "LG-FedAvg": train_method(base, "LG-FedAvg", sub, env, fraction=frac,
                                          model=set_state(initial_model(env), fedavg.state["weights"]))}
        for label, r in runs.items():
            table2.setdefault(label, [None] * 3)[g] = 100 * r.summary["acc"]
    published = {"FedAvg": [36.91, 42.09, 47.51], "Per-FedAvg (HF)": [70.72, 72.33, 75.13],
                 "pFedMe": [81.21, 84.08, 83.15], "LG-FedAvg": [73.93, 53.13, 54.72], "pFedHN": [85.38, 86.92, 87.20]}
    t2 = pd.DataFrame({(s, col): {m: (v[k] if col == "ours" else published[m][k]) for m, v in table2.items()}
                       for k, s in enumerate(widths) for col in ("ours", "paper")})
    print(f"Table 2, preset {preset}: test accuracy (%) per budget group (Per-FedAvg: the paper does not say which variant)")
    display(t2.round(2))
