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
out_dir = "runs/pfedhn_method"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0

# %%
import dataclasses

import matplotlib.pyplot as plt

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import hypernet as hn
from pflkit.fl.federation import federation_for
from pflkit.fl.loop import nbytes, run_rounds
from pflkit.models import count_params
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.runner import initial_model, make_env
from pflkit.stages import method_config

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
exp = session.resolve("pfedhn_table1_c10_n10")
fed = federation_for(exp.data, session.load(exp.data.dataset, **exp.data.options), exp.seed)
env = make_env(exp, fed, seed)
print(f"{session.dataset_label(exp)}, {fed.num_clients} clients, model {exp.model.name}, device {env.device}")
print("train samples per client:", fed.sizes("train"))

# %% [markdown]
# ## 1. The hypernetwork and the target network
# One linear head per target tensor, on a trunk of 3 hidden layers of 100 units; the embedding has
# floor(1 + n/4) entries (App. C.2.2). The target is the authors' LeNet (a small MLP when the notebook runs
# on the sklearn digits stand-in, `standin=True`).

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
cid = 0  # the Env is in round 0; run_rounds hands each round's phases env.at_round(t)
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
print(f"{session.dataset_label(exp)}: test accuracy (mean over clients) {100 * res.summary['acc']:.2f}% "
      f"(best validation at step {res.best_round})")
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
fig.suptitle(f"pFedHN on {session.dataset_label(exp)}, preset {preset}", fontsize=10)
fig.tight_layout()
save_figure(fig, session.figure("method_training.png"))
plt.show()

# %% [markdown]
# ## 4. How personal the generated models are before training
# Every head is `W z + b`: `b` is the same for every client, only `W z` depends on the client's embedding. At
# initialization the client-dependent part can be small next to the shared one, and then the hypernetwork starts
# as nearly one model for everyone and has to learn its way to personal ones. `personal_share` measures it per
# target tensor: the mean over clients of `||theta_i - mean_j theta_j||` over `||mean_j theta_j||`. Below, the
# hypernetwork of section 1 beside the variants of the paper's ablations: trunk depth (App. C.2.3), spectral
# normalization of every layer (App. C.3), and fixed class-proportion embeddings instead of learned ones (App. C.5).
# Nothing is trained here; the `[experiment] finding` of those experiments (REPRODUCTION.md) sets this beside
# what they reached at the `cpu` preset.

# %%
import numpy as np
import torch
from matplotlib.ticker import NullFormatter

from pflkit.algorithms.pfedhn import class_proportions
from pflkit.analysis.pfedhn import personal_share

targets, dim = state["spec"]["targets"], state["spec"]["embed_dim"]
variants = {f"depth {d}": dict(embed_dim=dim, depth=d) for d in range(1, 6)}
variants["depth 3, SN"] = dict(embed_dim=dim, spectral_norm=True)
variants["depth 3, fixed p_hat"] = dict(fixed_embeddings=class_proportions(fed))
share = {}
for label, kwargs in variants.items():
    torch.manual_seed(seed)
    variant = hn.HyperNetwork(fed.num_clients, targets, **kwargs).eval()
    with torch.no_grad():
        per_tensor = personal_share([variant(i) for i in range(fed.num_clients)])
    share[label] = float(np.mean([v for k, v in per_tensor.items() if k.endswith("weight")]))
for label, value in share.items():
    print(f"{label:22s} client-dependent / shared part of the generated weights: {value:.3f}")
fig, ax = plt.subplots(figsize=(6.5, 3))
ax.barh(list(share), list(share.values()), color=["C0"] * 5 + ["C1", "C2"])
ax.set_xscale("log")
ax.xaxis.set_minor_formatter(NullFormatter())  # major ticks only: the minor labels run into each other
for y, value in enumerate(share.values()):
    ax.annotate(f"{value:.3f}", (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
ax.set_xlim(right=3 * max(share.values()))
ax.invert_yaxis()
ax.set_xlabel("client-dependent / shared part at init (mean over weight tensors, log)")
ax.set_title(f"pFedHN at initialization, {fed.num_clients} clients of {session.dataset_label(exp)}", fontsize=10)
fig.tight_layout()
save_figure(fig, session.figure("method_personal_share.png"))
plt.show()

# %% [markdown]
# Why they can differ: at PyTorch's default initialization every extra trunk layer scales its input down,
# spectral normalization divides each head's `W z` by the largest singular value of `W` but leaves the shared
# biases alone, and class proportions (norm at most 1) are smaller inputs than N(0, 1) embeddings of the same
# size or more. Whether a hypernetwork that starts less personal also ends less accurate depends on the step
# budget; the findings under App. C.2.3, C.3 and C.5 in REPRODUCTION.md set these numbers beside the `cpu` runs.
# What this run shows:

# %%
depths = [share[f"depth {d}"] for d in range(1, 6)]
shrinks = all(a > b for a, b in zip(depths, depths[1:]))
print(f"- deeper trunks {'start less personal at every added layer' if shrinks else 'do not shrink it at every layer'}"
      f" here: {' > '.join(f'{v:.3f}' for v in depths) if shrinks else ', '.join(f'{v:.3f}' for v in depths)}")
for label in ("depth 3, SN", "depth 3, fixed p_hat"):
    word = "less" if share[label] < share["depth 3"] else "not less"
    print(f"- {label}: {word} personal than the plain hypernetwork ({share[label]:.3f} vs {share['depth 3']:.3f})")
