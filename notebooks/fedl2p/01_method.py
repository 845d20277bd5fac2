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
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu; paper
out_dir = "runs/fedl2p_method"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
results_root = None  # a folder of saved runs (<results_root>/demo/), e.g. pflkit reproduce's work folder

# %%
import matplotlib.pyplot as plt
import torch
from torch import nn

from pflkit.models.mixed_bn import convert_bn, init_client_stats, set_bn_mode
from pflkit.report.fedl2p import beta_summary, load_report, plot_hyperparameters, versus_finetuning
from pflkit.report.figures import plot_methods, save_figure
from pflkit.notebooks import setup

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)

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
save_figure(fig, session.figure("method_beta_one_layer.png"))
plt.show()

# %% [markdown]
# ## 2. The demo: FedAvg, three ways to fine-tune, and FedL2P
# `session.run` (`pflkit.runner.run_experiment`) pretrains with FedAvg, tests the global model, fine-tunes it
# per client with each fixed BN mode (lr and epochs fixed by hand), then learns FedL2P's meta-nets over a few
# rounds and personalizes every client with its own beta and eta. The same from a shell: `pflkit demo`. With
# `results_root` set, a finished run `<results_root>/demo/` of this preset is read instead of trained.

# %%
results = session.run("demo", results_root=results_root)
run_dir = session.run_dir("demo", results_root)
print(session.format_table(results))
print(versus_finetuning(results))

# %%
ax = plot_methods(results)
save_figure(ax.figure, session.figure("method_demo_accuracy.png"))
plt.show()

# %% [markdown]
# ## 3. What FedL2P learned
# The runner saves FedL2P's per-client hyperparameters (`seed0/fedl2p.report.json`). Boxes run over clients:
# beta per BN layer (left), eta per tensor (middle; 0 = frozen), and the share of frozen parameters per
# client (right). On these digits every client draws from one domain, so the paper's finding for CIFAR-10
# label shift applies: beta drifts towards 0 (keep the pretrained statistics) when training is long enough;
# with the few rounds of the small presets it moves only part of the way.

# %%
report = load_report(run_dir, "FedL2P", seed)
print(beta_summary(report))
fig = plot_hyperparameters(report, f"FedL2P on the demo (preset {preset})")
save_figure(fig, session.figure("method_hyperparameters.png"))
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
save_figure(fig, session.figure("method_xi_beta.png"))
plt.show()
print("history of the meta-learning rounds:", results["rounds"]["FedL2P"][f"seed{seed}"][:2])
