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
# # pflkit on Flower: the same algorithms, a distributed engine
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/tutorials/01_flower.ipynb)
#
# Every pflkit algorithm is five pure phase functions (`init`, `broadcast`, `client_update`, `aggregate`,
# `evaluate`). pflkit's own loop calls them in one process; `pflkit.flower` calls the very same functions
# inside [Flower](https://flower.ai)'s `ServerApp` and `ClientApp`, so an experiment can move from a notebook
# to many machines without rewriting the algorithm:
#
# | pflkit phase | where it runs on Flower |
# |---|---|
# | `init`, `aggregate` | the ServerApp's Strategy (`PflkitStrategy.aggregate_train`) |
# | `broadcast(state, cid)` | `PflkitStrategy.configure_train`: one message per sampled node |
# | `client_update` | the ClientApp's `train` handler, on the node whose `partition-id` is `cid` |
# | `evaluate` | the ClientApp's `evaluate` handler |
# | client state (heads, masks, posteriors) | the node's `Context.state` |
#
# This notebook runs the quickstart experiment (FedAvg, then fine-tuning) three ways: pflkit's loop, a local
# Flower run, and a Flower run where one client crashes. At the `smoke` preset the Flower run goes through
# Flower's messages in this process (`backend="inprocess"`, no Ray: Ray's start-up alone takes longer than the
# whole smoke run); at `cpu` and `paper` it is a real Flower simulation with one Ray actor per CPU.

# %% tags=["install"]
# Colab / fresh machine: install pflkit once (skipped when it is already importable)
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("pflkit") is None:
    subprocess.run(["git", "clone", "--depth", "1", "https://github.com/pflkit/pflkit.git"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "pflkit"], check=True)
    sys.path.insert(0, "pflkit")

# %%
# Flower and Ray (the `flower` extra of pflkit), if missing
if importlib.util.find_spec("flwr") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "flwr[simulation]>=1.41"], check=True)

# %% tags=["parameters"]
preset = "cpu"
out_dir = "runs/flower"
data_root = None
seed = 0
backend = None  # None: "inprocess" at the smoke preset, else "ray"

# %%
from pathlib import Path

import pandas as pd
import torch

from pflkit.experiments import resolve
from pflkit.flower.simulation import run_flower
from pflkit.report.tables import format_table
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tests run many notebooks side by side on few cores
out = Path(out_dir)
backend = backend or ("inprocess" if preset == "smoke" else "ray")
cfg = resolve("demo", preset, [f"seed={seed}"])
print(cfg.title, "|", cfg.data.num_clients, "clients | Flower backend:", backend)

# %% [markdown]
# ## 1. The same experiment on both engines
# `run_flower` starts one (virtual) SuperNode per client. Each node's `partition-id` names the pflkit client it
# holds, and the ServerApp samples clients with pflkit's own sampler and seeds, so the two runs below see the
# same clients, the same schedule and the same random streams: their numbers agree to float precision.

# %%
loop = run_experiment(cfg, out / "loop", data_root=data_root, progress=False)
flower = run_flower(cfg, out / "flower", data_root=data_root, backend=backend, num_cpus=2)
print(format_table(flower))

# %%
pd.DataFrame({label: {"pflkit loop": loop["methods"][label]["acc_mean"],
                      "Flower": flower["methods"][label]["acc_mean"]} for label in loop["methods"]}).T

# %% [markdown]
# ## 2. What travelled
# Each history row records the tensor bytes sent down (server to clients) and up per round, and which clients
# failed. Communication is one of the claims of these papers: FedL2P sends its meta-nets only (the pretrained
# model once per node), pFedHN the target network only, FedSelect the shared part only.

# %%
pd.DataFrame(flower["rounds"]["Global"]["seed0"])[["round", "clients", "train_loss", "val_acc", "bytes_down",
                                                   "bytes_up", "failed"]]

# %% [markdown]
# ## 3. A client that crashes
# On a real federation, nodes fail or answer late. A client that raises (or does not answer within
# `timeout` seconds) is left out of that round's aggregation; the round completes with the others and the
# history names who failed. `faults` injects such a failure: client 1 raises whenever it is asked to train.

# %%
faulty = run_flower(cfg, out / "faulty", data_root=data_root, backend=backend, num_cpus=2,
                    faults={"Global/1/*": "raise"})
rows = pd.DataFrame(faulty["rounds"]["Global"]["seed0"])
rows[["round", "clients", "completed", "failed", "train_loss"]]

# %% [markdown]
# ## 4. The same app on real machines
# The repository is a Flower App: `pyproject.toml` names pflkit's ServerApp and ClientApp
# (`[tool.flwr.app.components]`) and the run config they read (`[tool.flwr.app.config]`: the experiment, its
# preset, overrides, timeouts). To run it on a SuperLink and SuperNodes on other machines (each with pflkit
# installed and its data under `data-root`):
#
# ```bash
# # server machine
# flower-superlink --insecure
# # each client machine i = 0 .. N-1 (N = data.num_clients of the experiment)
# flower-supernode --insecure --superlink SERVER:9092 \
#     --node-config "partition-id=$i num-partitions=$N data-root='/data'"
# # your machine, in the repository: a connection named `lab` in ~/.flwr/config.toml
# #   [superlink.lab]
# #   address = "SERVER:9093"
# #   insecure = true
# flwr run . lab --run-config "experiment='demo' preset='cpu' out='/results/demo'" --stream
# ```
#
# The same app on Flower's own local simulation (the `local` connection Flower creates), with one simulated
# SuperNode per client; the variable keeps Flower from installing the app's dependencies into a new environment:
#
# ```bash
# flwr federation simulation-config @none/default local --num-supernodes 6
# FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 flwr run . --run-config "experiment='demo' preset='smoke'" --stream
# ```
#
# Use TLS and node authentication outside a trusted network (see Flower's deployment guides).
