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
# # FedL2P, the method (Lee et al., NeurIPS 2023): what $\beta$ and $\eta$ do
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/01_method.ipynb)
#
# **What you will learn**
# - what FedL2P learns: not a model, but *how each client fine-tunes* a pretrained one, through a batch-norm
#   mixing weight $\beta$ per BN layer and a learning rate $\eta$ per tensor, both output by small meta-nets;
# - what $\beta$ does to one batch-norm layer under a feature shift (Eq. 2), computed here in a second;
# - how to read what FedL2P learned on the demo: $\beta$ per layer and per client, and the sparsity of $\eta$.
#
# **Prerequisites**: [the quickstart](../tutorials/00_quickstart.ipynb) (label shift, FedAvg, the FT baselines).
# **Next**: [Table 2, label shift](02_label_shift.ipynb), then [domains](03_domains.ipynb).
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) every table and figure
# below is drawn from the committed result `results/cpu/demo.json` and nothing trains; `source = "train"`
# trains the demo here (`pflkit demo`), with progress bars. Where pflkit's defaults differ from the papers, and
# which option switches each: the fidelity ledger, [docs/fidelity.md](../../docs/fidelity.md).
#
# ## The method in four equations
# A batch-norm (BN) layer normalizes a feature $x$ with a mean and variance (Eq. 1):
# $$g(x) = \frac{x - \hat\mu}{\sqrt{\hat\sigma^2 + \epsilon}}\,\gamma + \delta .$$
# FedL2P mixes the pretrained model's statistics with client $i$'s own by a weight $\beta$ per BN layer (Eq. 2):
# $$\hat\mu = (1-\beta)\,\hat\mu_{pt} + \beta\,\hat\mu_i, \qquad
#   \hat\sigma^2 = (1-\beta)\,\hat\sigma^2_{pt} + \beta\,\hat\sigma^2_i .$$
# $\beta = 0$ is "FT (BN G)" (keep the pretrained statistics), $\beta = 1$ is "FT (BN C)" (the client's own).
# BNNet chooses $\beta$ from how far the client's features are from the pretrained ones in each BN layer $b$:
# a symmetric KL divergence averaged over the layer's $J$ channels, with $P_j$, $Q_j$ the pretrained and the
# client's Gaussian of channel $j$ (Eq. 3):
# $$\xi_{i,b} = \frac{1}{J}\sum_{j=1}^{J} \tfrac12\big(D_{KL}(P_j\,\|\,Q_j) + D_{KL}(Q_j\,\|\,P_j)\big).$$
# LRNet chooses a learning rate per weight and bias tensor from the mean and standard deviation of each
# layer's input features $x_m$ (Eq. 4):
# $$\boldsymbol\beta = \mathrm{BNNet}(w_{bn};\, \xi_1, \dots, \xi_B), \qquad
#   \boldsymbol\eta = \mathrm{LRNet}\big(w_{lr};\, E(x_0), SD(x_0), \dots, E(x_{M-1}), SD(x_{M-1})\big) \odot \tilde{\boldsymbol\eta}.$$
# $\eta = 0$ freezes a tensor; the share of parameters with $\eta = 0$ is the client's *sparsity*. The meta-nets'
# weights $\lambda = \{w_{bn}, w_{lr}, \tilde\eta\}$ are learned with FedAvg so that fine-tuning with them
# minimizes the clients' validation loss (Eq. 5):
# $$\min_\lambda \sum_{i=1}^{C} \frac{N_i}{\sum_{i'} N_{i'}}\, \mathcal L_{i,V}\big(\theta_i^*(\lambda), \lambda\big)
#   \quad\text{s.t.}\quad \theta_i^*(\lambda) = \arg\min_{\theta_i} \mathcal L_{i,T}(\theta_i, \lambda),$$
# each client computing the hypergradient of its validation loss by the implicit function theorem with a
# Neumann series (Alg. 2). A client never seen in training gets its $\beta$ and $\eta$ from one forward pass.

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
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu: the committed results; paper: a GPU's sizes
source = "results"  # results: draw from the committed results (no training); train: train here
out_dir = "runs/fedl2p_method"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
results_root = None  # train mode: a folder of saved runs (<results_root>/demo/) to read instead of training
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display
from torch import nn

from pflkit.models.mixed_bn import convert_bn, init_client_stats, set_bn_mode
from pflkit.notebooks.session import setup
from pflkit.report import readings
from pflkit.report.fedl2p.figures import load_report
from pflkit.report.fedl2p.learned import drawable, learned, learned_reading, meta_rounds, plot_learned
from pflkit.report.figures import constant_statement, plot_methods, save_figure, text_panel, visible_spread

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
session.run_times(["demo"])

# %% [markdown]
# ## 1. $\beta$ on one batch-norm layer (Eq. 2)
# A BN layer was pretrained on features with mean 0 and variance 1. A client's features are shifted (mean 2,
# standard deviation 3): a feature shift. `convert_bn` turns the layer into pflkit's `MixedBatchNorm`, whose
# client statistics come from one pass over the client's data (Alg. 1, line 6); we evaluate it at five values of
# $\beta$. This cell computes, it reads no result.
#
# *Look for*: at which $\beta$ the layer's output has mean 0 and standard deviation 1 again.

# %%
torch.manual_seed(seed)
layer = nn.Sequential(nn.BatchNorm1d(4))  # pretrained statistics: mean 0, variance 1
client_x = 2.0 + 3.0 * torch.randn(512, 4)
model = convert_bn(layer).eval()
init_client_stats(model, [client_x])
betas, means, stds = (0.0, 0.25, 0.5, 0.75, 1.0), [], []
for beta in betas:
    set_bn_mode(model, "mixed", beta)
    with torch.no_grad():
        y = model(client_x)
    means.append(float(y.mean()))
    stds.append(float(y.std()))
fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.plot(betas, means, "o-", label="mean of the output")
ax.plot(betas, stds, "s--", label="standard deviation of the output")
ax.axhline(0, color="grey", lw=0.6)
ax.set_xlabel("β (0: pretrained statistics, 1: the client's)")
ax.set_ylabel("BN output statistic (feature units)")
ax.set_title("One BN layer on a shifted client (mean 2, SD 3)")
ax.legend()
save_figure(fig, session.figure("method_beta_one_layer.png"))
plt.show()
display(Markdown(f"With β = 0 the output keeps the shift: mean {means[0]:+.2f}, standard deviation {stds[0]:.2f}. "
                 f"With β = 1 it is normalized: mean {means[-1]:+.2f}, standard deviation {stds[-1]:.2f}. "
                 "FedL2P learns where in between each layer of each client should be."))

# %% [markdown]
# ## 2. The demo: FedAvg, three ways to fine-tune, and FedL2P
# `pflkit demo` pretrains a small CNN with FedAvg on sklearn digits split among clients with Dir(0.1) labels,
# tests the global model, fine-tunes it per client with each fixed BN choice (learning rate and epochs fixed
# by hand), then learns FedL2P's meta-nets over a few rounds and fine-tunes every client with its own $\beta$
# and $\eta$.
#
# *Look for*: whether FedL2P, which chooses the BN statistics and learning rates itself, reaches the best of
# the hand-set FT variants.

# %%
results = session.run("demo", results_root=results_root)
run_dir = session.run_dir("demo", results_root)
display(readings.accuracy_frame(results, session.paper_header(results)))
ax = plot_methods(results, title=f"demo on {session.dataset_label(results)}: test accuracy per method")
save_figure(ax.figure, session.figure("method_demo_accuracy.png"))
plt.show()
display(Markdown(readings.methods_reading(results, reference="Global")))

# %% [markdown]
# ## 3. What FedL2P learned
# The batch stores, per client, FedL2P's mean $\beta$ over the BN layers and its sparsity, and per BN layer
# the mean $\beta$ over clients. The paper finds $\beta$ close to 0 on label shift (every client draws from
# one domain, so the pretrained statistics serve it, Fig. 2a) and high sparsity there.
#
# *Look for*: the height of each layer's bar (which statistics it keeps), and whether any client differs
# from the others; a quantity that does not vary across clients is stated in words, not drawn.

# %%
summary = learned(results, "FedL2P", seed, run_dir)
if drawable(summary):
    fig = plot_learned(summary, f"FedL2P on the demo ({session.dataset_label(results)}, preset {preset})")
    save_figure(fig, session.figure("method_hyperparameters.png"))
    plt.show()
display(Markdown(learned_reading(summary)))

# %% [markdown]
# BNNet maps its input $\xi$ (Eq. 3) to its output $\beta$, client by client: that is what lets a new client
# get its $\beta$ from one forward pass. The per-client $\xi$ is in the run's full report, not in the
# committed compact result, so this plot is drawn only with `source = "train"`.
#
# *Look for*: whether $\beta$ changes with $\xi$ at all; if every client gets the same $\beta$ it is stated.

# %%
if source == "train":
    report = load_report(run_dir, "FedL2P", seed)
    xi = [r["xi"][0] for r in report]
    b0 = [list(r["beta"].values())[0] for r in report]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    if visible_spread(b0, span=1.0):
        ax.plot(xi, b0, "o", label="one client")
        ax.set_xlabel("ξ of the first BN layer (Eq. 3; symmetric KL, nats)")
        ax.set_ylabel("β of the first BN layer")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
    else:
        text_panel(ax, constant_statement("β of the first BN layer", b0) + f",\nwhile ξ runs from {min(xi):.3g} "
                   f"to {max(xi):.3g}:\nBNNet gives every client the same β")
    ax.set_title("BNNet: input ξ against output β, first BN layer")
    save_figure(fig, session.figure("method_xi_beta.png"))
    plt.show()
else:
    display(Markdown("BNNet's ξ → β map needs each client's ξ, which only a fresh run stores: set "
                     f"`source = \"train\"` (the committed batch trained this in {session.training_time('demo')})."))

# %% [markdown]
# ## Takeaways
# Generated from the results above.

# %%
beta_line = ""
if summary:
    b = np.asarray(summary["beta_per_client"], dtype=float)
    beta_line = (f"\n- FedL2P's mean β is {b.mean():.3f}: "
                 + ("the paper's label-shift finding, β near 0 (keep the pretrained statistics), shows here."
                    if b.mean() < 0.1 else
                    f"not the paper's β near 0 for label shift. This preset learns the meta-nets for "
                    f"{meta_rounds(results)} rounds (the paper: 500), so the reduced preset does not show that "
                    "effect; the fidelity ledger lists the other reductions."))
display(Markdown(readings.personalization_takeaways(results, "Global") + beta_line + "\n"
                 f"- One seed at preset `{preset}`: differences smaller than the README's noise paragraph are "
                 "not findings."))

# %% [markdown]
# ## Exercises
# 1. **A bigger shift.** In section 1, set the client's features to mean 5, standard deviation 0.5. Which
#    $\beta$ now brings the output closest to mean 0, SD 1? Compare with the figure above.
# 2. **Longer meta-learning.** Set `source = "train"` and add the override `'methods."FedL2P".rounds=40'`
#    (four times the demo's; `pflkit/catalog/tutorials/demo.toml`) to `session.run("demo", ...)`. Does $\beta$ move towards 0
#    as in the paper's Fig. 2a? The committed reference is `results/cpu/demo.json` (the bars above).
# 3. **Another seed.** `source = "train"`, `seed = 1`: which per-layer $\beta$ keep their order?
