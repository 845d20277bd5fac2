# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # FedL2P Tables 3, 5 and 8 (Lee et al., NeurIPS 2023): feature shift across domains
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/03_domains.ipynb)
#
# **What you will learn**
# - what *feature shift* is: clients whose images look different (a domain each: MNIST, MNIST-M, USPS here;
#   corruptions of CIFAR-10 in CIFAR-10-C), on top of Dirichlet label skew inside each domain;
# - how FedL2P compares with the hand-set fine-tuning baselines there (Table 3), and what its ablations
#   (Table 5) and first-order meta-gradients (Table 8) change;
# - whether the learned $\beta$ differs between domains, and how to tell a real difference from one too small
#   to matter.
#
# **Prerequisites**: [the method](01_method.ipynb) ($\beta$, $\eta$, $\xi$) and [Table 2](02_label_shift.ipynb).
# **Next**: [clients never seen in training](04_unseen_clients.ipynb), then [Table 6, the analysis](05_analysis.ipynb).
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) every table and figure
# is drawn from the committed result `results/cpu/<experiment>.json`, nothing trains; `source = "train"`
# trains the row here, with progress bars. Where pflkit's defaults differ from the papers: the fidelity ledger,
# [docs/fidelity.md](../../docs/fidelity.md).
#
# ## What the meta-nets should do with domains
# Each BN layer mixes pretrained and client statistics by $\beta$ (Eq. 2):
# $\hat\mu = (1-\beta)\,\hat\mu_{pt} + \beta\,\hat\mu_i$, and likewise $\hat\sigma^2$. BNNet reads how far a
# client's features are from the pretrained model's in each BN layer $b$ (Eq. 3),
# $$\xi_{i,b} = \frac{1}{J}\sum_{j=1}^{J} \tfrac12\big(D_{KL}(P_j\,\|\,Q_j) + D_{KL}(Q_j\,\|\,P_j)\big),$$
# which is larger for a domain the pretrained model never saw. The paper's finding (Fig. 2b-d): with distinct
# domains $\beta$ moves above 0 (clients mix in their own statistics), unlike CIFAR-10 label shift where it
# goes to 0.
#
# Parameters: `dataset` is `digits` (MNIST / MNIST-M / USPS, offline), `cifar10c`, `domainnet` or `caltech10`;
# `alpha` the Dirichlet row (`1000`, `1p0`, `0p5`, `0p1`; `c3` / ignored for the one-client-per-domain rows);
# `table` 3, 5 or 8. The run is `pflkit/catalog/fedl2p/fedl2p_table{table}_{dataset}_a{alpha}.toml`.

# %% [markdown]
# **Data.** In train mode datasets are read from `data_root`, then `$PFLKIT_DATA`, then pflkit's cache, or
# downloaded when `download` is on (`data/README.md` says how to get each one). `standin = True` runs the same
# methods on sklearn digits instead: titles and tables then say STAND-IN.

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
out_dir = "runs/fedl2p_domains"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
seeds = 1
dataset = "digits"  # digits, cifar10c, domainnet, caltech10
alpha = "0p5"  # 1000, 1p0, 0p5, 0p1; c3: the digits row with one client per domain; caltech10 ignores it
table = 3  # 3, 5 or 8
results_root = None  # train mode: a folder of saved runs (<results_root>/<experiment>/) to read instead
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, Markdown, display

from pflkit.data.corruptions import CORRUPTIONS, corrupt
from pflkit.data.base import DatasetNotFoundError
from pflkit.notebooks.session import setup
from pflkit.report import readings
from pflkit.report.fedl2p.figures import client_groups, load_report, plot_hyperparameters_by_domain, versus_finetuning
from pflkit.report.fedl2p.learned import (
    drawable, learned, learned_reading, meta_rounds, paper_label, plot_beta_by_domain, plot_learned,
)
from pflkit.report.figures import plot_methods, save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
suffix = "" if dataset == "caltech10" else ("_c3" if alpha == "c3" else f"_a{alpha}")
name = f"fedl2p_table{table}_{dataset}{suffix}"
overrides = [] if seeds == session.resolve(name).seeds else [f"seeds={seeds}"]  # the committed row's seeds: none
cfg = session.resolve(name, *overrides)
display(Markdown(f"**{name}**: {cfg.title}, on {session.dataset_label(cfg)}"))
session.run_times([name])

# %% [markdown]
# ## 1. What the corruptions look like (CIFAR-10-C only)
# pflkit makes CIFAR-10-C itself (`pflkit.data.corruptions`, the published severity-3 parameters; `frost` uses a
# procedural frost texture since the published photographs are not shipped).
#
# *Look for*: which corruptions change the image statistics most (brightness, contrast, noise): those are the
# domains where a client's BN statistics differ most from the pretrained ones.

# %%
if cfg.data.dataset == "cifar10c":
    try:
        clean = session.load("cifar10").x_test[:6].permute(0, 2, 3, 1).numpy()
    except DatasetNotFoundError as err:
        clean = None
        display(Markdown(f"CIFAR-10 is not available here, so no examples are drawn: {str(err).splitlines()[0]}"))
    if clean is not None:
        grid = np.concatenate([np.concatenate(list(clean), 1)] +
                              [np.concatenate(list(corrupt(clean, c, 3, seed=seed)), 1) for c in CORRUPTIONS], 0)
        fig, ax = plt.subplots(figsize=(6, 11))
        ax.imshow(grid)
        ax.set_yticks(16 + 32 * np.arange(len(CORRUPTIONS) + 1), ["clean", *CORRUPTIONS])
        ax.set_xticks([])
        ax.set_title("CIFAR-10-C: six test images, clean and under each corruption (severity 3)")
        save_figure(fig, session.figure("cifar10c_examples.png"))
        plt.show()
else:
    display(Markdown(f"This row is on {session.dataset_label(cfg)}: corruption examples are drawn for "
                     "`dataset = 'cifar10c'`."))

# %% [markdown]
# ## 2. The table row
# *Look for*: which FT variant wins when the clients' features differ from the pretrained model's, and where
# FedL2P lands. The paper's numbers are on its own dataset (the legend says which): orientation, not a target.

# %%
results = session.run(name, *overrides, results_root=results_root)
run_dir = session.run_dir(name, results_root)
label = "FedL2P (IFT)" if "FedL2P (IFT)" in results["methods"] else "FedL2P"
display(readings.accuracy_frame(results, paper_label(results, session.paper_header(results))))
ax = plot_methods(results, paper_label=paper_label(results, session.paper_header(results)),
                  title=f"{name}: {session.dataset_label(results)}, test accuracy per method")
save_figure(ax.figure, session.figure(f"{name}_methods.png"))
plt.show()
display(Markdown(readings.methods_reading(results, reference=cfg.pretrain.label)))

# %% [markdown]
# ## 3. $\beta$ per domain
# Each client's mean $\beta$ over its BN layers, grouped by its domain (corruption / source). The paper finds
# $\beta$ above 0 on every domain dataset. A difference between domains counts only if it is visible on the
# $[0, 1]$ scale $\beta$ lives on; below that the values are stated, not drawn.
#
# *Look for*: how far above 0 the clients sit, and whether the domains separate.

# %%
summary = learned(results, label, seed, run_dir)
names = None
if summary and summary.get("domains") is not None:
    try:
        names = session.load(cfg.data.dataset, **cfg.data.options).meta.group_names.get(
            "corruption" if cfg.data.dataset == "cifar10c" else "domain")
    except DatasetNotFoundError:
        display(Markdown(f"{cfg.data.dataset} is not available here: domains are shown by their index."))
    ax = plot_beta_by_domain(summary, names, f"{name}: {label}'s mean β per client, by domain")
    save_figure(ax.figure, session.figure(f"{name}_beta_by_domain.png"))
    plt.show()
display(Markdown(learned_reading(summary, label, names)))

# %% [markdown]
# ## 4. $\beta$ per layer, and the sparsity of $\eta$
# *Look for*: which BN layers mix in client statistics (a bar above 0) and whether any tensor is frozen.

# %%
if drawable(summary):
    fig = plot_learned(summary, f"{name} ({session.dataset_label(results)}): {label}, preset {preset}", names)
    save_figure(fig, session.figure(f"{name}_hyperparameters.png"))
    plt.show()

# %% [markdown]
# $\eta$ per tensor and domain needs the run's full report (per client, per tensor), which the committed
# compact result does not store: it is drawn with `source = "train"`.

# %%
if source == "train" and summary and summary.get("domains") is not None:
    groups = client_groups(run_dir, "corruption" if cfg.data.dataset == "cifar10c" else "domain", seed)
    fig = plot_hyperparameters_by_domain(load_report(run_dir, label, seed), groups, names,
                                         f"{name}: {label}'s β / η by domain (preset {preset})")
    save_figure(fig, session.figure(f"{name}_hyperparameters_by_domain.png"))
    plt.show()
elif source != "train":
    display(Markdown(f"Not drawn in results mode: training this row took the committed batch "
                     f"{session.training_time(name)}."))

# %% [markdown]
# ## Takeaways
# Generated from the paper's claims that pflkit checks (`pflkit.report.claims`) on this row, and from the
# results above.

# %%
claims = session.checked_claims("fedl2p", [name], results_root)
checked = [c for c in claims if c.verdict != "not run"]
vs = versus_finetuning(results, label)
lines = [readings.takeaways(checked, preset)]
if vs["gain"] is not None:
    lines.append(f"- {label} against the best FT baseline ({vs['best_ft_label']}, {vs['best_ft']:.1f}%): "
                 f"{readings.signed(vs['gain'])} points.")
if summary:
    b = np.asarray(summary["beta_per_client"], dtype=float)
    lines.append(f"- Mean β over clients {b.mean():.3f}, spread {b.max() - b.min():.2g} across all clients: "
                 + ("the meta-nets give the domains visibly different β." if b.max() - b.min() >= 0.01 else
                    "the meta-nets give every client practically the same β, so the domains are not told apart "
                    f"at this preset ({meta_rounds(results, label)} meta-rounds; "
                    "[05_analysis](05_analysis.ipynb), section 5, looks at why)."))
if len(checked) < len(claims):
    lines.append(f"- {len(claims) - len(checked)} more of the paper's claims need other rows; "
                 "[02_label_shift](02_label_shift.ipynb) and [05_analysis](05_analysis.ipynb) check them.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. **Less label skew.** Set `alpha = "1000"` (labels nearly uniform inside each domain; still results mode).
#    Does $\beta$ move, and does FedL2P's gain over FT change? Reference: `results/cpu/fedl2p_table3_digits_a1000.json`.
# 2. **Ablation.** Set `table = 5`: BNNet alone and LRNet alone with $\beta$ fixed to 0 or 1. Which part of FedL2P
#    carries the gain? Reference: `results/cpu/fedl2p_table5_digits_a0p5.json`.
# 3. **Corruptions.** Set `dataset = "cifar10c"`: does $\beta$ separate corruptions better than the digit
#    domains? Reference: `results/cpu/fedl2p_table3_cifar10c_a0p5.json`.
