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
# # pflkit on Flower: one algorithm, three engines (the quickstart experiment)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/tutorials/01_flower.ipynb)
#
# **What you will learn**
# - how an algorithm written as five pure phase functions runs unchanged on pflkit's loop and on
#   [Flower](https://flower.ai)'s `ServerApp` / `ClientApp`, and why both give the same numbers;
# - what travels between server and clients each round, in bytes, for FedAvg and for FedL2P;
# - what a federation does when a client crashes, and how to start the same app on real machines.
#
# **Prerequisites**: [the quickstart](00_quickstart.ipynb) (the experiment run here). **Next**: the README's
# "Running on Flower" (a SuperLink and SuperNodes on one machine, step by step), then
# [FedL2P, the method](../fedl2p/01_method.ipynb).
#
# **Run time**: the table under the first code cell, from the committed batch's timings. By default
# (`source = "results"`) the notebook shows the committed local run of the experiment
# (`results/cpu/demo.json`): its table and what travelled each round, with no training and without Flower;
# `source = "train"` runs the Flower engine here, beside pflkit's loop, and the crash of section 3.
#
# Every pflkit algorithm is five pure phase functions (`init`, `broadcast`, `client_update`, `aggregate`,
# `evaluate`). pflkit's own loop calls them in one process; `pflkit.flower` calls the very same functions
# inside Flower's apps, so an experiment moves from a notebook to many machines without a rewrite:
#
# | pflkit phase | where it runs on Flower |
# |---|---|
# | `init`, `aggregate` | the ServerApp's Strategy (`PflkitStrategy.aggregate_train`) |
# | `broadcast(state, cid)` | `PflkitStrategy.configure_train`: one message per sampled node |
# | `client_update` | the ClientApp's `train` handler, on the node whose `partition-id` is `cid` |
# | `evaluate` | the ClientApp's `evaluate` handler |
# | client state (heads, masks, posteriors) | the node's `Context.state` |
#
# At the `smoke` preset the Flower run goes through Flower's messages in this process (`backend="inprocess"`,
# no Ray: Ray's start-up alone takes longer than the whole smoke run); at `cpu` and `paper` it is a real Flower
# simulation with one Ray actor per CPU. Where pflkit's defaults differ from the papers (and which option
# switches each): the fidelity ledger, [docs/fidelity.md](../../docs/fidelity.md).

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

# %%
# Flower and Ray (the `flower` extra of pflkit), if missing
import importlib.util

if importlib.util.find_spec("flwr") is None:  # also in results mode: a Colab reader may switch to train
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "flwr[simulation]>=1.42"], check=True)

# %% tags=["parameters"]
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu: the committed results; paper
source = "results"  # results: the committed local run, no training; train: run it on Flower here
out_dir = "runs/flower"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True
standin = False
figures_dir = None
seed = 0
backend = None  # None: "inprocess" at the smoke preset, else "ray"
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from pflkit.notebooks.session import setup

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
backend = backend or ("inprocess" if preset == "smoke" else "ray")
cfg = session.resolve("demo")
display(Markdown(f"**{cfg.title}** on {session.dataset_label(cfg)}: {cfg.data.num_clients} clients"
                 + (f"; Flower backend `{backend}`" if source == "train" else "")))
session.run_times(["demo"])

# %% [markdown]
# ## 1. The same experiment on both engines
# `run_flower` starts one (virtual) SuperNode per client. Each node's `partition-id` names the pflkit client it
# holds, and the ServerApp samples clients with pflkit's own sampler and seeds, so the two runs below see the
# same clients, the same schedule and the same random streams: their numbers agree to float precision.

# %%
loop = session.run("demo")
if source == "train":
    from pflkit.flower.simulation import run_flower

    flower = run_flower(cfg, session.out / "flower", data_root=session.data_root, backend=backend, num_cpus=2)
    print(session.format_table(flower))
else:
    flower = loop
    print(session.format_table(loop))
    display(Markdown("The committed run is pflkit's loop; `source = \"train\"` runs the Flower engine beside it. "
                     "That both give the same numbers is checked by `tests/flower/` (in-process Flower) and by "
                     "`.ci/run`'s deployment test (a SuperLink and SuperNodes as real processes)."))

# %%
if source == "train":
    display(pd.DataFrame({label: {"pflkit loop": loop["methods"][label]["acc_mean"],
                                  "Flower": flower["methods"][label]["acc_mean"]} for label in loop["methods"]}).T)

# %% [markdown]
# ## 2. What travelled
# Each history row records the tensor bytes sent down (server to clients) and up in that round, and which
# clients failed (the table shows the rounds that also validated the model). FedAvg (McMahan et al., 2017, Alg. 1) sends the model $w^t$ to each sampled client
# $k \in S_t$ and averages what comes back, weighted by the clients' sample counts $n_k$:
# $$w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{j \in S_t} n_j}\, w_k^{t+1},$$
# so a round moves $|S_t| \cdot 4P$ bytes each way for a model of $P$ float32 parameters. Communication is one
# of the claims of these papers. FedL2P's Alg. 1 (line 5) sends the pretrained model $\theta_g$ and the
# meta-nets' parameters $\lambda$ down every round and each client's $\lambda_i$ up; pflkit's loop counts
# both every round, while on Flower a node keeps $\theta_g$ after its first message and then receives a version
# token in its place, so a Flower run's rows show the model once per node. pFedHN sends the target network
# only, FedSelect the shared part only.

# %%
travel = pd.DataFrame(flower["rounds"]["Global"]["seed0"])
validated = travel[travel["val_acc"].notna()] if "val_acc" in travel else travel  # the rounds that validated
validated[[c for c in ("round", "clients", "train_loss", "val_acc", "bytes_down", "bytes_up", "failed")
           if c in travel]].head(8).round(4)

# %% [markdown]
# *Look for*: the slope of each line (the bytes of one round) and where it ends (the stage's total). The
# fine-tuning stages (FT) send nothing: each client fine-tunes the global model it already holds.

# %%
from pflkit.report import readings
from pflkit.report.figures import save_figure, use_style

use_style()
history = {stage: h["seed0"] for stage, h in flower["rounds"].items() if h.get("seed0")}
fig, ax = plt.subplots(figsize=(6.4, 3.4))
for stage, rows in history.items():
    rows = pd.DataFrame(rows)
    ax.plot(rows["round"], (rows["bytes_down"] + rows["bytes_up"]).cumsum() / 1e6,
            marker="o" if len(rows) <= 12 else None, ms=4, label=stage)
ax.set_xlabel("round")
ax.set_ylabel("MB sent, down + up (cumulative)")
ax.set_title(f"What travelled: {cfg.name} at preset {preset}")
ax.legend(title="stage")
save_figure(fig, session.figure("flower_communication.png"))
plt.show()
display(Markdown(readings.communication_reading(history)))

# %% [markdown]
# ## 3. A client that crashes
# On a real federation, nodes fail or answer late. A client that raises (or does not answer within
# `timeout` seconds) is left out of that round's aggregation; the round completes with the others and the
# history names who failed. `faults` injects such a failure: client 1 raises whenever it is asked to train.

# %%
if source == "train":
    faulty = run_flower(cfg, session.out / "faulty", data_root=session.data_root, backend=backend, num_cpus=2,
                        faults={"Global/1/*": "raise"})
    rows = pd.DataFrame(faulty["rounds"]["Global"]["seed0"])
    display(rows[["round", "clients", "completed", "failed", "train_loss"]])
else:
    display(Markdown("Section 3 runs only with `source = \"train\"`: the committed results hold no run with an "
                     "injected crash."))

# %% [markdown]
# ## 4. The same app on real machines
# The repository is a Flower App: `pyproject.toml` names pflkit's ServerApp and ClientApp
# (`[tool.flwr.app.components]`) and the run config they read (`[tool.flwr.app.config]`: the experiment, its
# preset, overrides, timeouts). To run it on a SuperLink and SuperNodes on other machines (each with pflkit
# installed and its data under `data-root`):
#
# ```bash
# # server machine (Flower >= 1.42: one port for Fleet, Control and runtime APIs)
# flower-superlink --insecure --host 0.0.0.0 --port 8000 --disable-runtime-dependency-installation
# # each client machine i = 0 .. N-1 (N = data.num_clients of the experiment)
# flower-supernode --insecure --superlink SERVER:8000 --port 9094 \
#     --node-config "partition-id=$i num-partitions=$N data-root='/data' state-dir='/states/$i'"
# # your machine, in the repository: a connection named `lab` in ~/.flwr/config.toml
# #   [superlink.lab]
# #   address = "SERVER:8000"
# #   insecure = true
# flwr run . lab --run-config "experiment='demo' preset='cpu' out='/results/demo'" --stream
# # resume a stopped run: add resume=true to --run-config
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
# Outside a trusted network use TLS (`--ssl-certfile`/`--ssl-keyfile` on the SuperLink, `--root-certificates` on
# the SuperNodes, no `--insecure`) and node authentication (`--enable-supernode-auth`,
# `--auth-supernode-private-key`); the README's "Running on Flower" shows all of it on one machine.

# %% [markdown]
# ## Takeaways
# Generated from the run above.

# %%
failed = readings.failed_clients(history)
display(Markdown(
    "- The algorithm is the same code on both engines: the ServerApp samples clients with pflkit's sampler and "
    "seeds, so a Flower run reproduces the loop's table (checked in `tests/flower/` in-process and by `.ci/run`'s "
    "deployment test with real processes).\n"
    + readings.communication_takeaway(history) + "\n"
    + (f"- Clients that failed in this run: {failed}." if failed else
       "- No client failed in this run; section 3 (with `source = \"train\"`) shows a round that loses one.")))

# %% [markdown]
# ## Exercises
# 1. **Two engines, one table.** Set `preset = "smoke"` and `source = "train"` (seconds). Compare the loop's and
#    Flower's accuracies in the table of section 1: in which digit, if any, do they differ, and why may they
#    (float summation order)? The reference is `tests/flower/`'s record comparison.
# 2. **A late client.** In section 3 replace `"raise"` by `"sleep:5"` and pass `timeout=2` to `run_flower`
#    (its docstring gives the fault syntax). Which rounds name the client now, and does Global's accuracy
#    move against section 1?
# 3. **Real processes.** Follow section 4 on one machine with two terminals per node (the README's "Running on
#    Flower" gives the exact commands) and compare the run's `results.json` with `runs/flower`'s: the
#    deployment test asserts they are equal.
