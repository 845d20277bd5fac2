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
# # pFedHN, step by step: a hypernetwork that writes every client's model
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/01_method.ipynb)
#
# Shamsian et al., *Personalized Federated Learning using Hypernetworks* (ICML 2021). The server holds a
# **hypernetwork** h(v; phi): it maps a client's embedding v_i to the full weights theta_i of that client's
# network (sec. 3.2). One step of Alg. 1:
#
# 1. the server computes theta_i = h(v_i; phi) and sends it: **only the target network travels**;
# 2. the client runs K = 50 local SGD steps from theta_i and returns delta theta = theta_tilde - theta_i;
# 3. the server moves phi and v_i down the surrogate 1/2 ||theta_tilde - h(v_i; phi)||^2, whose gradient is
#    the vector-Jacobian product -(d theta_i / d phi)^T delta theta.
#
# The hypernetwork can be far larger than the target network at no communication cost. This notebook runs
# each phase by hand on a small federation, checks that the update really pulls h(v_i) toward theta_tilde,
# then trains for a few hundred steps and reads the traffic from the history.

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
out_dir = "runs/pfedhn_method"
data_root = None
seed = 0

# %%
import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import hypernet as hn
from pflkit.analysis.pfedhn import experiment_federation, method_config
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.fl.loop import nbytes, run_rounds
from pflkit.models import count_params
from pflkit.report.figures import save_figure
from pflkit.runner import initial_model, make_env

if preset == "smoke":
    torch.set_num_threads(1)  # tests run many notebooks side by side on few cores
root = data_root or ("../../../shared/data" if Path("../../../shared/data").is_dir() else None)
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/pfedhn")
# offline without the CIFAR-10 files (fresh Colab / CI): the embedded digits and a small MLP instead
fallback = [] if root else ["data.dataset=digits", "model.name=mlp", "model.options={}"]
exp = resolve("pfedhn_table1_c10_n10", "smoke" if preset == "smoke" else "cpu", [f"seed={seed}"] + fallback)
dataset = load_dataset(exp.data.dataset, root)
fed = experiment_federation(exp, dataset)
env = make_env(exp, fed, seed)
print(exp.title, "|", fed.num_clients, "clients, train sizes", fed.sizes("train"))

# %% [markdown]
# ## 1. The hypernetwork and the target network
# One linear head per target tensor, on a trunk of 3 hidden layers of 100 units; the embedding has
# floor(1 + n/4) entries (App. C.2.2). The target is the authors' LeNet.

# %%
algo, cfg = method_config(exp, "pFedHN")
state = algo.init(initial_model(env), fed, cfg, env)
net = hn.materialize(state["spec"], state["hnet"])
target = env.model_fn()
print(f"hypernetwork: {count_params(net):,} parameters (embedding dim {state['spec']['embed_dim']})")
print(f"target network: {count_params(target):,} parameters = {nbytes(dict(target.state_dict())) / 2**10:.1f} KiB per message")
for name, shape in list(state["spec"]["targets"].items()):
    print(f"  head for {name:14s} {str(shape):18s}")

# %% [markdown]
# ## 2. One step of Alg. 1 by hand

# %%
env.round = 0
cid = 0
msg = algo.broadcast(state, cid, cfg, env)                       # theta_i = h(v_i; phi)
update, _ = algo.client_update(msg, fed.clients[cid], None, cfg, env)  # K local steps -> delta theta
new_state = algo.aggregate(state, [update], cfg, env)             # VJP through h, server SGD step
delta = update.payload["delta"]
tilde = {k: msg["theta"][k] + delta[k] for k in delta}


def gap(s):
    theta = algo.broadcast(s, cid, cfg, env)["theta"]
    return sum(float(((tilde[k] - theta[k]) ** 2).sum()) for k in tilde) ** 0.5


# the surrogate's gradient is a descent direction: a small plain step shrinks the gap to theta_tilde ...
small = dataclasses.replace(cfg, server_lr=1e-4, server_momentum=0.0, server_weight_decay=0.0)
print(f"client {cid}: local loss {update.metrics['loss']:.3f}, |delta theta| = {gap(state):.4f}")
print(f"||theta_tilde - h(v; phi)|| after a plain step of rate 1e-4: {gap(algo.aggregate(state, [update], small, env)):.6f} (before: {gap(state):.6f})")
# ... while the paper's rate (1e-2, momentum 0.9) can overshoot on one step: h is large and its Jacobian
# amplifies; over many steps and clients the average direction is what matters (section 3 below)
print(f"... after the paper's step (rate {cfg.server_lr}): {gap(new_state):.4f}")
print(f"bytes sent down {nbytes(msg)}, up {nbytes(update.payload)}; hypernetwork bytes never sent: {nbytes(state['hnet'])}")

# %% [markdown]
# ## 3. Training: one client per step
# `run_rounds` calls the same three phases. A pFedHN "round" is one server step with one sampled client
# (the paper's protocol); validation every `eval_every` steps keeps the best state (early stopping).

# %%
steps = 12 if preset == "smoke" else 300
res = run_rounds(get_algorithm("pfedhn"), method_config(exp, "pFedHN", rounds=steps, eval_every=max(1, steps // 10))[1],
                 fed, initial_model(env), env)
print(f"test accuracy (mean over clients): {100 * res.summary['acc']:.2f}%  (best validation at step {res.best_round})")
rows = [r for r in res.history if "val_acc" in r]
fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
ax[0].plot([r["round"] for r in rows], [100 * r["val_acc"] for r in rows], marker="o")
ax[0].set_xlabel("server step")
ax[0].set_ylabel("validation accuracy (%)")
ax[1].plot([r["round"] for r in res.history], [(r["bytes_down"] + r["bytes_up"]) / 2**10 for r in res.history])
ax[1].axhline(2 * nbytes(state["hnet"]) / 2**10, color="r", ls="--", label="2 x hypernetwork size")
ax[1].set_yscale("log")
ax[1].set_xlabel("server step")
ax[1].set_ylabel("KiB per step (down + up)")
ax[1].legend()
fig.tight_layout()
save_figure(fig, fig_dir / "method_training.png")
plt.show()
