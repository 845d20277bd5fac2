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
# # pFedHN Fig. 3: are the generated feature extractors really personal?
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/04_mix_and_match.ipynb)
#
# pFedHN-PC (sec. 3.3) lets the hypernetwork generate each client's feature extractor theta_i while the client
# keeps its own classifier omega_i. With a personal classifier, the hypernetwork *could* give everyone the same
# feature extractor. Sec. 5.4 tests this: train on CIFAR-10 split among 10 clients with 2 classes each, then
# evaluate client i's test data with client j's feature extractor and client i's own classifier. Rows: clients
# (their classifier and data); columns: whose feature extractor. Values are accuracies normalized per row,
# (acc_ij - min_l acc_il) / (max_l acc_il - min_l acc_il).
#
# **Data and device.** CIFAR-10 is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); when none of these works the notebook stops with an error naming it. `standin=True`
# runs sklearn's digits instead (with a small CNN), and every title, table and printout then names the stand-in.
# `device="auto"` uses a GPU when there is one; figures go to `figures_dir` (default `out_dir/figures`).
# With `results_root` pointing at a folder of saved runs (`<results_root>/<experiment>/`, e.g. the work folder of
# `pflkit reproduce`, which keeps this experiment's trained states), the trained model is read from the run made
# with the same settings and data instead of being trained again.
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
out_dir = "runs/pfedhn_mix_and_match"
data_root = None
device = "auto"
download = True
standin = False
figures_dir = None
seed = 0
results_root = None  # a folder of saved runs (<results_root>/<experiment>/), e.g. pflkit reproduce's work folder

# %%
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from pflkit.algorithms.pfedhn import mix_and_match
from pflkit.analysis.pfedhn import client_classes, row_normalize
from pflkit.fl.federation import federation_for
from pflkit.notebooks import setup
from pflkit.report.figures import save_figure
from pflkit.runner import make_env
from pflkit.stages import method_config

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed)
exp = session.resolve("pfedhn_fig3_mixmatch")
data_label = session.dataset_label(exp)
dataset = session.load(exp.data.dataset, **exp.data.options)
fed = federation_for(exp.data, dataset, exp.seed)
env = make_env(exp, fed, seed)
# the batch's run of this experiment, when it kept pFedHN-PC's trained states (same settings and data), else here
res = session.trained(exp, "pFedHN-PC", fed, env, dataset, results_root)
print(f"pFedHN-PC on {data_label}, {fed.num_clients} clients: mean test accuracy {100 * res.summary['acc']:.2f}%")

# %%
_, cfg = method_config(exp, "pFedHN-PC")
acc = mix_and_match(res.state, res.client_states, fed, cfg, env)
labels = [" / ".join(c) for c in client_classes(fed)]
off = acc[~np.eye(len(acc), dtype=bool)]
print(f"own feature extractor: {100 * np.diag(acc).mean():.1f}% on average; another client's: {100 * off.mean():.1f}%")
fig, ax = plt.subplots(figsize=(7.5, 6))
sns.heatmap(row_normalize(acc), annot=len(acc) <= 12, fmt=".2f", cmap="viridis", xticklabels=labels,
            yticklabels=labels, ax=ax, cbar_kws={"label": "row-normalized accuracy"})
ax.set_xlabel("feature extractor of client j")
ax.set_ylabel("client i (its data and classifier)")
ax.set_title(f"pFedHN-PC mix-and-match (Fig. 3) on {data_label}, preset {preset}", fontsize=10)
fig.tight_layout()
save_figure(fig, session.figure("mix_and_match.png"))
plt.show()
