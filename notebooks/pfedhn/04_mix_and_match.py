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
# **What you will learn**
# - what pFedHN-PC generates (each client's feature extractor) and what it keeps on the client (its classifier);
# - how the mix-and-match test of sec. 5.4 tells personal extractors from one shared extractor;
# - how to read a row-normalized heatmap, and what the normalization hides.
#
# **Prerequisites**: [01_method](01_method.ipynb) (the hypernetwork and its update rule). **Next**:
# [05_embeddings](05_embeddings.ipynb) (what the client embeddings learn).
#
# **Run time**: the table under the first code cell, from the committed batch's timings. By default
# (`source = "results"`) the notebook reads the committed result in `results/cpu/` and shows the committed
# figure, training nothing; `source = "train"` trains pFedHN-PC here (or reads its kept states from
# `results_root`, e.g. the work folder of `pflkit reproduce`) and draws the figure anew. CIFAR-10 is read from
# `data_root` or `$PFLKIT_DATA`, or downloaded; `standin=True` uses sklearn's digits, named as such in every
# title. Where pflkit's defaults differ from the paper: [docs/fidelity.md](../../docs/fidelity.md).

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
out_dir = "runs/pfedhn_mix_and_match"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one
download = True
standin = False
figures_dir = None  # None: out_dir/figures
seed = 0
results_root = None  # train mode: a folder of saved runs (<results_root>/<experiment>/) whose trained states to read
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
from IPython.display import Markdown, display

from pflkit.notebooks.session import setup
from pflkit.report.pfedhn import figures as report

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
name = "pfedhn_fig3_mixmatch"
session.run_times([name])

# %% [markdown]
# ## 1. pFedHN-PC: a generated feature extractor, a personal classifier
# pFedHN (Eq. 3) learns one hypernetwork $h(\cdot;\varphi)$ and one embedding $v_i$ per client, and gives client
# $i$ the whole target network $\theta_i = h(v_i;\varphi)$. pFedHN-PC (sec. 3.3) generates only the feature
# extractor $\theta_i = h(v_i;\varphi)$; the last layer $\omega_i$ stays on the client and is trained there
# (Eq. 4):
#
# $$\arg\min_{\varphi,\, v_1,\dots,v_n,\, \omega_1,\dots,\omega_n}\ \frac{1}{n}\sum_{i=1}^{n}
#   \mathcal{L}_i(\theta_i, \omega_i), \qquad \theta_i = h(v_i;\varphi). \tag{4}$$
#
# The experiment (sec. 5.4): CIFAR-10 split among 10 clients with two classes each; after training, client
# $i$'s test data is classified by client $j$'s feature extractor $\theta_j$ and client $i$'s own classifier
# $\omega_i$, for every pair. Fig. 3 normalizes each row (the caption of Fig. 3):
#
# $$\text{norm-acc}_{i,j} = \frac{\text{acc}_{i,j} - \min_\ell \text{acc}_{i,\ell}}
#   {\max_\ell \text{acc}_{i,\ell} - \min_\ell \text{acc}_{i,\ell}} .$$

# %%
committed = session.committed(name) if source == "results" else None
if committed is not None:
    m = committed["methods"]["pFedHN-PC"]
    display(Markdown(f"The committed run: pFedHN-PC on {session.dataset_label(committed)}, "
                     f"{committed['config']['data']['num_clients']} clients, mean test accuracy "
                     f"**{m['acc_mean']:.2f}%** (best validation at round {m['best_round'][0]})."))

# %% [markdown]
# ## 2. Mix and match (Fig. 3)
# *Look for*: the outlined diagonal (each client's own extractor). If the hypernetwork gave everyone the same
# extractor, every row would be flat; if the extractors are personal, the diagonal is the brightest cell of
# its row, as in the paper, where it is 1 in every row.

# %%
if source == "train":
    import matplotlib.pyplot as plt

    from pflkit.algorithms.pfedhn import mix_and_match
    from pflkit.analysis.pfedhn import client_classes
    from pflkit.fl.federate import federation_for
    from pflkit.report.figures import save_figure
    from pflkit.run.environment import make_env
    from pflkit.run.stages import method_config

    exp = session.resolve(name)
    data_label = session.dataset_label(exp)
    dataset = session.load(exp.data.dataset, **exp.data.options)
    fed = federation_for(exp.data, dataset, exp.seed)
    env = make_env(exp, fed, seed)
    print(f"{name}: training pFedHN-PC here unless results_root holds its kept states; "
          f"the committed batch took {session.training_time(name)}")
    res = session.trained(exp, "pFedHN-PC", fed, env, dataset, results_root)
    print(f"pFedHN-PC on {data_label}, {fed.num_clients} clients: mean test accuracy {100 * res.summary['acc']:.2f}%")
    _, cfg = method_config(exp, "pFedHN-PC")
    acc = mix_and_match(res.state, res.client_states, fed, cfg, env)
    labels = [" / ".join(c) for c in client_classes(fed)]
    fig = report.plot_mix_and_match(acc, labels, f"pFedHN-PC mix-and-match (Fig. 3), {data_label}, preset {preset}")
    save_figure(fig, session.figure("mix_and_match.png"))
    plt.show()
    display(Markdown(report.mix_and_match_reading(acc)))
else:
    import matplotlib.pyplot as plt
    import numpy as np

    from pflkit.report.figures import save_figure

    kept = committed.get("analysis", {}).get("pFedHN-PC", {}).get("seeds", [])
    if kept and "mix_and_match" in kept[0]:
        arrays = kept[0]
        acc = np.asarray(arrays["mix_and_match"], dtype=float) / 100  # stored in %, the figure reads fractions
        names = arrays.get("class_names")
        labels = [" / ".join(names[c] if names else str(c) for c in cls) for cls in arrays["classes"]]
        fig = report.plot_mix_and_match(acc, labels, f"pFedHN-PC mix-and-match (Fig. 3), "
                                                     f"{session.dataset_label(committed)}, preset {preset}")
        save_figure(fig, session.figure("mix_and_match.png"))
        plt.show()
        display(Markdown(report.mix_and_match_reading(acc)))
    else:
        display(Markdown(f"The committed result of `{name}` keeps no mix-and-match matrix (it predates "
                         "`report_mix_and_match`): rerun it with `pflkit reproduce --only " + name + "`, or set "
                         f"`source=\"train\"` (training took the committed batch {session.training_time(name)})."))

# %% [markdown]
# ## Takeaways
# - pFedHN-PC shares one hypernetwork, yet the question of sec. 5.4 is whether what it generates is still
#   personal; the mix-and-match matrix answers it per client pair, which a mean accuracy cannot.
# - Row normalization stretches every row to $[0, 1]$: a row whose accuracies differ by a point looks as
#   contrasted as one that differs by forty. Read the raw accuracies (the sentence under the figure in train
#   mode) before concluding.
# - The reading under the figure (train mode) says in how many rows the diagonal is the best; at the reduced
#   `cpu` preset (a CIFAR-10 subset, fewer rounds) the extractors may be less personal than the paper's.

# %% [markdown]
# ## Exercises
# 1. **Another seed.** Set `source = "train"`, `seed = 1`: in how many rows is the diagonal still the best?
#    Compare with the committed figure (`figures/pfedhn/mix_and_match.png`) and the paper's Fig. 3.
# 2. **A personal classifier vs none.** pFedHN (no personal classifier) on the same clients is Table 1's
#    10-client row, `results/cpu/pfedhn_table1_c10_n10.json` (drawn by [02_tables](02_tables.ipynb)): is
#    pFedHN-PC's accuracy there above pFedHN's?
# 3. **Smoke.** Set `preset = "smoke"`, `source = "train"`: how flat are the rows when the model barely trained?
