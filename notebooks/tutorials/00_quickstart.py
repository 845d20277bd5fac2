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
# # pflkit quickstart: label shift, FedAvg, and three ways to fine-tune
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/tutorials/00_quickstart.ipynb)
#
# This notebook walks through the embedded default experiment (`pflkit demo`):
#
# 1. load scikit-learn's handwritten digits (they ship with scikit-learn, so this runs offline);
# 2. split them among clients with **Dirichlet label shift** (FedL2P sec. 4.1: each client's label
#    proportions are drawn from Dir(alpha); small alpha = very different clients);
# 3. train a **global model with FedAvg**;
# 4. **personalize** it on every client by fine-tuning, in the three ways FedL2P compares (sec. 4.1.2):
#    normalizing with the client's batch-norm statistics (BN C), the global model's (BN G),
#    or each incoming batch's (BN I).
#
# The `preset` parameter sets the size: `smoke` (seconds, what the tests run), `cpu` (the README's numbers),
# `paper` (longer). A preset changes sizes only, never the algorithm.
#
# Where pflkit's defaults differ from the papers (and which option switches each): the fidelity ledger,
# [docs/fidelity.md](../../docs/fidelity.md).

# %% tags=["install"]
# Colab / fresh machine: clone and install pflkit once. Skipped when pflkit is importable, also after
# "Restart runtime". The clone goes to "pflkit-src": a folder named "pflkit" here would shadow the package.
import importlib
import subprocess
import sys
from pathlib import Path

src = Path("pflkit-src").absolute()
if (src / "pflkit" / "__init__.py").exists() and str(src) not in sys.path:
    sys.path.insert(0, str(src))  # beats a stray pflkit/ folder in the working directory
try:  # a real install imports its submodules from a regular package (a namespace one has no __file__)
    import pflkit.cli

    installed = getattr(sys.modules["pflkit"], "__file__", None) is not None
except ImportError:
    installed = False
if not installed:
    if not src.exists():
        subprocess.run(["git", "clone", "--depth", "1", "https://github.com/pflkit/pflkit.git", str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(src)], check=True)
    # usable now, without a restart: the clone on sys.path, a stale namespace "pflkit" forgotten
    sys.path.insert(0, str(src))
    for mod in [m for m in sys.modules if m == "pflkit" or m.startswith("pflkit.")]:
        del sys.modules[mod]
    importlib.invalidate_caches()

# %% tags=["parameters"]
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu; paper
out_dir = "runs/quickstart"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True
standin = False
figures_dir = None  # None: out_dir/figures
seed = 0
results_root = None  # a folder of saved runs (<results_root>/demo/), e.g. pflkit reproduce's work folder

# %%
import matplotlib.pyplot as plt
import numpy as np

from pflkit.fl.federation import federation_for
from pflkit.notebooks import setup
from pflkit.report.figures import plot_label_distribution, plot_methods, plot_rounds, save_figure
from pflkit.report.tables import results_table

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
cfg = session.resolve("demo")
print(cfg.title, "|", session.dataset_label(cfg))

# %% [markdown]
# ## 1. The data and the clients
# `federation_for` builds the experiment's clients exactly as `pflkit run` does: it partitions the pooled
# samples, then holds out 20% of each client's samples for test and 20% of the rest for validation (FedL2P's
# ratios). Each bar below is one client; colours are digit classes.

# %%
dataset = session.load(cfg.data.dataset, **cfg.data.options)
d = cfg.data
fed = federation_for(d, dataset, seed)
ax = plot_label_distribution(fed)
ax.set_title(f"{session.dataset_label(cfg)}: classes per client")
save_figure(ax.figure, session.figure("label_distribution.png"))
plt.show()
print("train samples per client:", fed.sizes("train"))

# %% [markdown]
# ## 2. FedAvg, then fine-tuning on every client
# `session.run` (`pflkit.runner.run_experiment`) trains the pretraining stage (FedAvg: each round a fraction
# of clients trains locally and the server averages their weights, weighted by sample count), tests the global
# model on each client ("Global"), then fine-tunes it on each client's train split with each BN mode and tests
# it. Everything lands in `out_dir/demo/results.json` (with `results_root` set, a finished run
# `<results_root>/demo/` of this preset is read instead).

# %%
results = session.run("demo", results_root=results_root)
print(session.format_table(results))

# %%
ax = plot_rounds(results, "val_acc")
ax.set_title("FedAvg: mean validation accuracy over clients")
save_figure(ax.figure, session.figure("fedavg_rounds.png"))
plt.show()

# %%
ax = plot_methods(results)
save_figure(ax.figure, session.figure("demo_methods.png"))
plt.show()

# %% [markdown]
# ## 3. Reading the table
# Under label shift, each client sees only a few classes. The global model must serve all clients, so
# fine-tuning it on the client's own data usually helps (FedL2P Table 2, alpha = 0.1). Which BN statistics
# help depends on the shift: here all clients draw from one image domain, so the global statistics are
# sensible; under feature shift (other domains, corruptions) the client's statistics matter more.
# Per-client accuracies are in `results["methods"][label]["per_client"]`:

# %%
table = results_table(results)
table[["method", "ours", "status"]]

# %%
per_client = {label: np.array(m["per_client"][0]) for label, m in results["methods"].items()}
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.boxplot(list(per_client.values()), tick_labels=list(per_client))
ax.set_ylabel("client test accuracy (%)")
save_figure(fig, session.figure("per_client_accuracy.png"))
plt.show()
