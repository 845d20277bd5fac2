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
# # Quickstart: label shift, FedAvg, fine-tuning and FedL2P on sklearn digits
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/tutorials/00_quickstart.ipynb)
#
# **What you will learn**
# - what *label shift* between clients looks like, and how a Dirichlet draw makes it;
# - how FedAvg trains one global model for all clients, and why that model serves no client best;
# - three ways to fine-tune it on each client (which batch-norm statistics to keep), and what FedL2P learns
#   instead: a mix of those statistics ($\beta$) and a learning rate per layer ($\eta$), per client.
#
# **Prerequisites**: Python and a first PyTorch model; no federated learning. **Next**:
# [FedL2P, the method](../fedl2p/01_method.ipynb), then [Table 2](../fedl2p/02_label_shift.ipynb).
#
# **Run time**: the table under the first code cell, from the committed batch's timings. By default
# (`source = "results"`) every table and figure below is drawn from the committed results in `results/cpu/`,
# so *Run all* takes seconds and trains nothing; `source = "train"` trains the experiment here, with progress
# bars. The experiment is `pflkit demo` (the file `pflkit/catalog/tutorials/demo.toml`). Where pflkit's
# defaults differ from the papers, and which option switches each: the fidelity ledger,
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
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu: the committed results; paper: a GPU's sizes
source = "results"  # results: draw from the committed results (no training); train: train here
out_dir = "runs/quickstart"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True
standin = False
figures_dir = None  # None: out_dir/figures
seed = 0
results_root = None  # train mode: a folder of saved runs (<results_root>/demo/) to read instead of training
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from pflkit.fl.federate import federation_for
from pflkit.notebooks.session import setup
from pflkit.report import readings
from pflkit.report.figures import plot_label_distribution, plot_methods, plot_per_client, plot_rounds, save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
cfg = session.resolve("demo")
display(Markdown(f"**{cfg.title}** on {session.dataset_label(cfg)}"))
session.run_times(["demo"])

# %% [markdown]
# ## 1. The clients and their labels
# Each client $i$ draws its class proportions $q_i \sim \mathrm{Dir}(\alpha\,\mathbf{1})$ and takes its
# samples in those proportions (FedL2P, Sec. 4.1). A small $\alpha$ concentrates $q_i$ on a few classes; as
# $\alpha \to \infty$ every client gets the same mixture. The demo uses the paper's hardest setting,
# $\alpha = 0.1$. `federation_for` builds the clients exactly as `pflkit run` does, then holds out 20% of each
# client's samples for test and 20% of the rest for validation (FedL2P's ratios).
#
# *Look for*: how many colours each bar has. A bar of one or two colours is a client that has seen only
# one or two digits.

# %%
dataset = session.load(cfg.data.dataset, **cfg.data.options)
fed = federation_for(cfg.data, dataset, seed)
ax = plot_label_distribution(fed, title=f"{session.dataset_label(cfg)}, Dir({cfg.data.partition['alpha']}): "
                                       "training samples of each digit per client")
save_figure(ax.figure, session.figure("label_distribution.png"))
plt.show()
display(Markdown(readings.label_shift_reading(fed)))

# %% [markdown]
# ## 2. FedAvg: one model for every client
# Each round $t$ the server sends the weights $w^t$ to a sample $S_t$ of the clients (a quarter of them
# here); each client runs a few epochs of SGD on its own data and returns $w_i^{t+1}$; the server averages
# them, weighted by the clients' sample counts $n_i$:
#
# $$w^{t+1} = \sum_{i \in S_t} \frac{n_i}{\sum_{j \in S_t} n_j}\, w_i^{t+1}.$$
#
# Every few rounds the model is tested on every client's validation split; the round with the highest mean is
# the one kept, the **Global** model that every later method starts from.
#
# *Look for*: the curve rises fast, then wobbles: with $\alpha = 0.1$ each round's sample of clients sees a
# different few classes, so the average moves towards them.

# %%
results = session.run("demo", results_root=results_root)
ax = plot_rounds(results, "val_acc", title="FedAvg: mean validation accuracy over clients")
save_figure(ax.figure, session.figure("fedavg_rounds.png"))
plt.show()
display(Markdown(readings.rounds_reading(results, cfg.pretrain.label)))

# %% [markdown]
# ## 3. Personalizing the global model
# Fine-tuning (FT) starts from the Global model and runs a few epochs of SGD on one client's training data.
# The network has batch-norm (BN) layers, which normalize a feature $x$ with a mean and variance
# (FedL2P, Eq. 1):
#
# $$g(x) = \frac{x - \hat\mu}{\sqrt{\hat\sigma^2 + \epsilon}}\,\gamma + \delta .$$
#
# Which $(\hat\mu, \hat\sigma^2)$ to use is the choice the three FT baselines make: the client's own running
# statistics (**FT (BN C)**), the global model's (**FT (BN G)**), or each incoming batch's (**FT (BN I)**).
#
# **FedL2P** does not pick one by hand. Two small meta-networks, trained across clients with federated
# learning, look at a client's data through the global model and output, for that client, a mixing weight
# $\beta$ per BN layer and a learning rate $\eta$ per layer (Eq. 2 and 4):
#
# $$\hat\mu = (1-\beta)\,\hat\mu_{pt} + \beta\,\hat\mu_i, \qquad
#   \hat\sigma^2 = (1-\beta)\,\hat\sigma^2_{pt} + \beta\,\hat\sigma^2_i .$$
#
# $\beta = 0$ keeps the pretrained (global) statistics, like FT (BN G); $\beta = 1$ uses the client's own,
# like FT (BN C). A learning rate $\eta = 0$ freezes a layer.
#
# *Look for*: which bars rise above Global, and whether FedL2P reaches the best FT variant.

# %%
display(readings.accuracy_frame(results, session.paper_header(results)))
ax = plot_methods(results, title=f"demo on {session.dataset_label(results)}: test accuracy per method")
save_figure(ax.figure, session.figure("demo_methods.png"))
plt.show()
display(Markdown(readings.methods_reading(results, reference=cfg.pretrain.label)))

# %% [markdown]
# *Look for*: the spread over clients. A mean hides that a method can help most clients and hurt a few.

# %%
ax = plot_per_client(results, title="demo: test accuracy of each client, per method")
save_figure(ax.figure, session.figure("per_client_accuracy.png"))
plt.show()
display(Markdown(readings.per_client_reading(results, "FedL2P", cfg.pretrain.label) + " "
                 + readings.beta_reading(results.get("analysis") or {}, "FedL2P")))

# %% [markdown]
# ## Takeaways
# Generated from the results above.

# %%
display(Markdown(readings.personalization_takeaways(results, cfg.pretrain.label) + "\n" +
                 f"- One seed at preset `{preset}`: the README's noise paragraph says how far a rerun on another CPU "
                 "moved such numbers: a difference smaller than that spread is not a finding."))

# %% [markdown]
# ## Exercises
# 1. **Less label shift.** Set `source = "train"` and add the override `"data.partition.alpha=1.0"` to
#    `session.run("demo", ...)`. Does the gap between Global and the FT variants shrink? The reference at the
#    paper's scale of that question is Table 2's $\alpha = 1.0$ row, `results/cpu/fedl2p_table2_a1p0_e5.json`
#    (drawn by [fedl2p/02_label_shift](../fedl2p/02_label_shift.ipynb)).
# 2. **Another seed.** Set `source = "train"`, `seed = 1`. Which differences in the table survive? Compare
#    with the noise paragraph of the README.
# 3. **Smoke.** Set `preset = "smoke"` and `source = "train"`: it runs in seconds. Why are its numbers
#    meaningless, and which plot shows it first?
