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
# # FedL2P, Tables 1 and 2: label shift on CIFAR-10
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/02_label_shift.ipynb)
#
# **What you will learn**
# - how FedL2P's personalization compares with the hand-picked fine-tuning baselines when clients differ only in
#   their labels (Table 2: Dirichlet $\alpha$ from 1000, nearly i.i.d., to 0.1, very skewed);
# - what the meta-nets learned per client: the BN mix $\beta$ (Eq. 2) and the layer-wise learning rates
#   $\eta$ (Eq. 4), and why the paper expects $\beta \to 0$ here (Fig. 2a);
# - whether the result holds when the pretraining changes (Table 1: FedAvg, Per-FedAvg (HF), FedBABU);
# - which of the paper's claims the reduced `cpu` preset reproduces, and which it does not.
#
# **Prerequisites**: [the quickstart](../tutorials/00_quickstart.ipynb) (label shift, FT (BN C/G/I)) and
# [FedL2P, the method](01_method.ipynb). **Next**: [feature shift across domains](03_domains.ipynb), where
# $\beta$ is expected to move away from 0.
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) every table, figure and
# verdict is drawn from the committed results in `results/cpu/`, with no training; `source = "train"` trains
# the row chosen by `alpha` and `epochs` here, with progress bars. Every row is a file in
# `pflkit/catalog/fedl2p/`; from a shell: `pflkit run fedl2p_table2_a0p1_e5 --preset cpu`. Where pflkit's
# defaults differ from the paper, and which option switches each: the fidelity ledger,
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

# %% [markdown]
# **Data.** In train mode, datasets are read from `data_root`, then `$PFLKIT_DATA`, then pflkit's cache, or
# downloaded when `download` is on (`data/README.md` says how to get each one). `standin = True` runs the same
# methods on sklearn digits instead, labelled STAND-IN.

# %% tags=["parameters"]
preset = "cpu"  # smoke: seconds, meaningless numbers; cpu: the committed results; paper: a GPU's sizes
source = "results"  # results: draw from the committed results (no training); train: train here
out_dir = "runs/fedl2p_label_shift"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --commit --figures` writes figures/
seed = 0
seeds = 1  # train mode: seeds of the row trained here
alpha = "0p1"  # the row of section 1: one of 1000, 1p0, 0p5, 0p1
epochs = 5  # its fine-tuning epochs: 5 or 15
results_root = None  # train mode: a folder of saved runs (<results_root>/<experiment>/) to read instead
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from pflkit.notebooks.session import setup
from pflkit.report import readings
from pflkit.report.fedl2p.figures import versus_finetuning
from pflkit.report.figures import plot_client_values, plot_methods, save_figure
from pflkit.report.tables import ours_vs_paper

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
name = f"fedl2p_table2_a{alpha}_e{epochs}"
table2, table1 = session.rows("fedl2p_table2_"), session.rows("fedl2p_table1_")
display(Markdown(f"Section 1 shows **{name}** ({session.dataset_label(session.resolve(name))}); "
                 f"sections 3-4 every committed row of Table 2 ({len(table2)} files) and Table 1 ({len(table1)})."))
session.run_times([name] if source == "train" else [*table2, *table1])

# %% [markdown]
# ## 1. One row of Table 2
# Methods run in order: FedAvg pretraining (**Global**: the global model tested on every client), the three FT
# baselines, **L2P** (the meta-nets learned by each client alone, no federation) and **FedL2P**, whose
# meta-nets $\lambda$ are learned across clients (Eq. 5):
#
# $$\min_{\lambda} \sum_{i=1}^{C} \frac{N_i}{\sum_{i'} N_{i'}}\, \mathcal{L}_{i,V}\big(\theta_i^*(\lambda),
#   \lambda\big) \quad \text{s.t.}\quad \theta_i^*(\lambda) = \arg\min_{\theta_i}
#   \mathcal{L}_{i,T}(\theta_i, \lambda).$$
#
# Each client fine-tunes the global model with its hyperparameters (the inner problem), and the meta-nets are
# moved to lower the validation loss after fine-tuning (the outer problem). Accuracy is the mean over
# clients of each client's test accuracy.
#
# *Look for*: FedL2P's bar against the best of the three FT bars; the black diamonds are the paper's
# numbers, at the paper's scale.

# %%
results = session.run(name, f"seeds={seeds}", results_root=results_root)
data_label = session.dataset_label(results)
display(readings.accuracy_frame(results, session.paper_header(results)))
ax = plot_methods(results, paper_label=f"{session.paper_header(results)} (the paper's scale)",
                  title=f"{name}: {data_label}")
save_figure(ax.figure, session.figure(f"{name}_methods.png"))
plt.show()
display(Markdown(readings.methods_reading(results, reference="Global")))

# %% [markdown]
# ## 2. What FedL2P learned (Fig. 2a)
# For each client the meta-nets output $\beta$ per BN layer (0: the pretrained statistics, 1: the client's own)
# and a learning rate $\eta$ per layer. With every client drawing from one image domain, the paper finds
# $\beta \to 0$: the global statistics are the better estimate, especially for a client with few samples.
# The `cpu` preset runs 20 meta rounds where the paper runs 500, so $\beta$ has less time to travel.
#
# *Look for*: where each client's $\beta$ sits between 0 and 1, and whether the clients differ at all.

# %%
analysis = results.get("analysis") or {}
betas = readings.client_values(analysis, "beta_per_client")
ax = plot_client_values(betas, "β, mean over BN layers", f"{name}: each client's learned β (0 = global BN statistics)")
if ax is not None:
    ax.set_ylim(-0.05, 1.05)
    save_figure(ax.figure, session.figure(f"{name}_beta.png"))
    plt.show()
display(Markdown("\n\n".join([*(readings.beta_reading(analysis, k) for k in betas),
                               *(readings.sparsity_reading(analysis, k) for k in betas)])))

# %% [markdown]
# ## 3. Table 2: every $\alpha$ and both fine-tuning budgets
# Each cell is ours (the paper's) in %, over the committed rows of this preset. Rows are $(\alpha, e)$.
#
# *Look for*: whether the gap between FedL2P and the best FT baseline grows as $\alpha$ shrinks (more
# label shift), as in the paper.

# %%
rows2 = [session.committed(n) for n in table2] if source == "results" else [results]
display(ours_vs_paper(rows2, {"alpha": "data.partition.alpha", "e": "methods.0.epochs"}))
gains = [(r["config"]["data"]["partition"]["alpha"], r["config"]["methods"][0]["epochs"],
          versus_finetuning(r)) for r in rows2]
gains.sort(key=lambda t: (t[0], t[1]))
display(Markdown("FedL2P minus the best FT baseline, in points: " + ", ".join(
    f"α={a}, e={e}: {readings.signed(g['gain'])} ({g['best_ft_label']})" for a, e, g in gains if g["gain"] is not None) + "."))

# %% [markdown]
# ## 4. Table 1: another pretraining
# The global model comes from FedAvg, Per-FedAvg (HF) or FedBABU; then FT (BN C) and FedL2P personalize it.
#
# *Look for*: whether FedL2P stays at or above FT (BN C) whatever the pretraining.

# %%
rows1 = [session.committed(n) for n in table1] if source == "results" else []
if rows1:
    display(ours_vs_paper(rows1, {"pretraining": "pretrain.label", "alpha": "data.partition.alpha"},
                          pretrained="pretrained model"))
    diffs = [r["methods"]["FedL2P"]["acc_mean"] - r["methods"]["FT (BN C)"]["acc_mean"] for r in rows1
             if r["methods"]["FedL2P"]["status"] == "ok" and r["methods"]["FT (BN C)"]["status"] == "ok"]
    display(Markdown(f"FedL2P minus FT (BN C) over the {len(diffs)} rows: from {min(diffs):+.1f} to "
                     f"{max(diffs):+.1f} points (median {np.median(diffs):+.1f})."))
else:
    print("Table 1 is shown from the committed results (source='results'); train a row with "
          "session.run('fedl2p_table1_fedbabu_a0p1')")

# %% [markdown]
# ## Takeaways
# Generated from the paper's claims that pflkit checks (`pflkit.report.claims`) on the rows above.

# %%
claims = [c for c in session.checked_claims("fedl2p", [*table2, *table1] if source == "results" else [name],
                                            results_root) if c.verdict != "not run"]
display(Markdown(readings.takeaways(claims, preset)))

# %% [markdown]
# ## Exercises
# 1. **More label shift, fewer epochs.** Set `alpha = "1000"` and then `"0p1"` (with `epochs = 5`): in section 1,
#    which FT variant wins each time, and does FedL2P follow it? The reference numbers are the paper's Table 2
#    (the diamonds).
# 2. **Train a row.** Set `source = "train"`, `alpha = "0p5"`, `epochs = 5`: compare your table with the committed
#    row `results/cpu/fedl2p_table2_a0p5_e5.json` (section 3 shows it). The time it will take is printed first.
# 3. **β at scale.** In `pflkit/catalog/fedl2p/fedl2p_table2_a0p1_e5.toml`, compare the `cpu` preset's meta
#    rounds with the `paper` preset's. With a GPU, set `preset = "paper"`, `source = "train"`: does β reach 0?
