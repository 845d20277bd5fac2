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
# # FedL2P, the method: what beta and eta do
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/01_method.ipynb)
#
# FedL2P (Lee et al., NeurIPS 2023) does not train a new global model: it learns **how each client should
# fine-tune** a given pretrained model. Two small MLPs, the *meta-nets*, read statistics of the client's data
# and output that client's personalization hyperparameters:
#
# * **BNNet -> beta**, one number per batch-norm layer (Eq. 2): the layer normalizes with
#   `(1 - beta) * pretrained statistics + beta * client statistics`. beta = 0 is "FT (BN G)", beta = 1 is
#   "FT (BN C)"; in between is a blend. Its input xi (Eq. 3) is how far the client's features are from the
#   pretrained model's, a symmetric KL divergence per BN layer.
# * **LRNet -> eta**, one learning rate per weight / bias tensor (Eq. 4): eta = 0 freezes a tensor, so
#   "fine-tune only the head" or "only the BN layers" are special cases. The share of parameters with eta = 0
#   is the *sparsity*.
#
# The meta-nets' weights lambda are learned with FedAvg: each sampled client fine-tunes, computes the
# hypergradient of its validation loss with respect to lambda (implicit function theorem, Alg. 2), takes a few
# SGD steps on lambda and sends it back. This notebook shows beta on one layer, then runs the embedded demo
# (sklearn digits with label shift: FedAvg, FT (BN C / G / I), FedL2P) and looks at what FedL2P learned.

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
out_dir = "runs/fedl2p_method"
data_root = None
seed = 0

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch import nn

from pflkit.experiments import resolve
from pflkit.io import read_json
from pflkit.models.mixed_bn import convert_bn, init_client_stats, set_bn_mode
from pflkit.report.fedl2p import beta_summary, load_report, plot_hyperparameters, versus_finetuning
from pflkit.report.figures import plot_methods, save_figure
from pflkit.report.tables import format_table
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tiny models on a shared CPU: one thread avoids oversubscription
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/fedl2p")

# %% [markdown]
# ## 1. beta on one batch-norm layer (Eq. 2)
# A BN layer was pretrained on features with mean 0 and variance 1. A client's features are shifted (mean 2,
# standard deviation 3): feature shift. `convert_bn` turns the layer into pflkit's `MixedBatchNorm`, whose
# client statistics come from one pass over the client's data (Alg. 1, line 6). Evaluated with beta = 0 the
# layer keeps the shift; with beta = 1 it removes it; FedL2P learns where in between each layer should be.

# %%
torch.manual_seed(seed)
layer = nn.Sequential(nn.BatchNorm1d(4))  # pretrained statistics: mean 0, variance 1
client_x = 2.0 + 3.0 * torch.randn(512, 4)
model = convert_bn(layer).eval()
init_client_stats(model, [client_x])
rows = []
for beta in (0.0, 0.25, 0.5, 0.75, 1.0):
    set_bn_mode(model, "mixed", beta)
    with torch.no_grad():
        y = model(client_x)
    rows.append((beta, float(y.mean()), float(y.std())))
    print(f"beta = {beta:.2f}: normalized features have mean {rows[-1][1]:+.2f}, std {rows[-1][2]:.2f}")
fig, ax = plt.subplots(figsize=(4.5, 3))
ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label="mean")
ax.plot([r[0] for r in rows], [r[2] for r in rows], "s-", label="std")
ax.set_xlabel("beta")
ax.set_title("BN output on a shifted client")
ax.legend()
save_figure(fig, fig_dir / "method_beta_one_layer.png")
plt.show()

# %% [markdown]
# ## 2. The demo: FedAvg, three ways to fine-tune, and FedL2P
# `run_experiment` pretrains with FedAvg, tests the global model, fine-tunes it per client with each fixed BN
# mode (lr and epochs fixed by hand), then learns FedL2P's meta-nets over a few rounds and personalizes every
# client with its own beta and eta. The same from a shell: `pflkit demo`.

# %%
cfg = resolve("demo", preset, [f"seed={seed}"])
results = run_experiment(cfg, out, data_root=data_root, progress=False)
print(format_table(results))
print(versus_finetuning(results))

# %%
ax = plot_methods(results)
save_figure(ax.figure, fig_dir / "method_demo_accuracy.png")
plt.show()

# %% [markdown]
# ## 3. What FedL2P learned
# The runner saves FedL2P's per-client hyperparameters (`seed0/fedl2p.report.json`). Boxes run over clients:
# beta per BN layer (left), eta per tensor (middle; 0 = frozen), and the share of frozen parameters per
# client (right). On these digits every client draws from one domain, so the paper's finding for CIFAR-10
# label shift applies: beta drifts towards 0 (keep the pretrained statistics) when training is long enough;
# with the few rounds of the small presets it moves only part of the way.

# %%
report = load_report(out, "FedL2P", seed)
print(beta_summary(report))
fig = plot_hyperparameters(report, f"FedL2P on the demo (preset {preset})")
save_figure(fig, fig_dir / "method_hyperparameters.png")
plt.show()

# %% [markdown]
# BNNet's input xi (Eq. 3) against its output beta, client by client: a meta-net maps data statistics to
# hyperparameters, so a new client gets its beta from one forward pass, without any search.

# %%
xi = [r["xi"][0] for r in report]
b0 = [list(r["beta"].values())[0] for r in report]
fig, ax = plt.subplots(figsize=(4.5, 3))
ax.scatter(xi, b0)
ax.set_xlabel("xi of the first BN layer (Eq. 3)")
ax.set_ylabel("beta of the first BN layer")
save_figure(fig, fig_dir / "method_xi_beta.png")
plt.show()
print("history of the meta-learning rounds:", read_json(out / "results.json")["rounds"]["FedL2P"][f"seed{seed}"][:2])
