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
# # pFedHN Fig. 4: what the client embeddings learn
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/05_embeddings.ipynb)
#
# **What you will learn**
# - what a client embedding $v_i$ is: the hypernetwork's only client-specific input;
# - how to test whether similar clients get similar embeddings (sec. 5.5), with a t-SNE picture and two
#   numbers measured on the embeddings themselves;
# - why a t-SNE picture alone is not evidence (its axes have no unit, and it distorts distances).
#
# **Prerequisites**: [01_method](01_method.ipynb). **Next**: [04_mix_and_match](04_mix_and_match.ipynb) (the
# other side of personalization: how different the generated networks are).
#
# **Run time**: the table under the first code cell, from the committed batch's timings. By default
# (`source = "results"`) the notebook reads the committed result in `results/cpu/` and shows the committed
# figure, training nothing; `source = "train"` trains pFedHN here (or reads its kept states from
# `results_root`, e.g. the work folder of `pflkit reproduce`) and draws the figure anew.
#
# **The data.** The paper builds 100 CIFAR-100 clients, each drawing from one of the 20 coarse classes, and
# colours the t-SNE by coarse class. Offline pflkit uses the same design on Omniglot: every client draws from a
# single alphabet (several clients per alphabet; `pflkit/catalog/pfedhn/pfedhn_fig4_embeddings.toml`).
# `standin=True` uses sklearn's digits instead (one digit per client, the digit as its group), named as such in
# every title. Where pflkit's defaults differ from the paper: [docs/fidelity.md](../../docs/fidelity.md).

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
out_dir = "runs/pfedhn_embeddings"
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
name = "pfedhn_fig4_embeddings"
session.run_times([name])

# %% [markdown]
# ## 1. Client embeddings
# pFedHN (Eq. 3) trains the hypernetwork's weights $\varphi$ and one embedding $v_i \in \mathbb{R}^d$ per client
# together:
#
# $$\arg\min_{\varphi,\, v_1,\dots,v_n}\ \frac{1}{n}\sum_{i=1}^{n} \mathcal{L}_i\big(h(v_i;\varphi)\big). \tag{3}$$
#
# A client's network is $\theta_i = h(v_i;\varphi)$, so two clients with nearby embeddings get similar networks.
# If the hypernetwork shares what clients have in common, clients whose data look alike (here: the same
# alphabet) should end up with nearby $v_i$. Two measurements on the $d$-dimensional embeddings say whether
# they do: the share of clients whose nearest other embedding belongs to the same group (against the chance
# share), and the silhouette of the groups ($-1$ to $1$; $1$ is tight, separate groups).

# %%
if source == "results":
    committed = session.committed(name)
    m = committed["methods"]["pFedHN"]
    display(Markdown(f"The committed run: pFedHN on {session.dataset_label(committed)}, "
                     f"{committed['config']['data']['num_clients']} clients, mean test accuracy "
                     f"**{m['acc_mean']:.2f}%** (best validation at step {m['best_round'][0]})."))

# %% [markdown]
# ## 2. The t-SNE of the embeddings (Fig. 4)
# *Look for*: whether points of one colour sit together. t-SNE keeps neighbours, not distances: the gaps
# between clusters and the axes mean nothing, which is why the two numbers above the figure are measured on the
# embeddings, not on this picture.

# %%
if source == "train":
    import matplotlib.pyplot as plt
    import numpy as np

    from pflkit.algorithms.pfedhn import embeddings
    from pflkit.analysis.embeddings import embedding_report, tsne_2d
    from pflkit.fl.federate import federation_for
    from pflkit.report.figures import save_figure
    from pflkit.run.environment import make_env

    exp = session.resolve(name)
    if exp.data.scheme != "domains":
        # the digits stand-in has no alphabets: each client holds a single digit, and the digit is its group
        exp = session.resolve(name, "data.scheme=pathological", "data.partition={ classes_per_client = 1 }")
    data_label = session.dataset_label(exp)
    dataset = session.load(exp.data.dataset, **exp.data.options)
    fed = federation_for(exp.data, dataset, exp.seed)
    if exp.data.scheme == "domains":
        groups, names, group = fed.group_of_clients("alphabet"), dataset.meta.group_names["alphabet"], "alphabet"
    else:
        groups, names, group = fed.histograms().argmax(1), dataset.meta.class_names, "digit"
    print(f"{data_label}: {fed.num_clients} clients in {len(np.unique(groups))} groups")
    env = make_env(exp, fed, seed)
    print(f"{name}: training pFedHN here unless results_root holds its kept states; "
          f"the committed batch took {session.training_time(name)}")
    res = session.trained(exp, "pFedHN", fed, env, dataset, results_root)
    emb = embeddings(res.state).detach().cpu().numpy()
    measured = embedding_report(emb, groups)
    print(f"pFedHN on {data_label}: mean test accuracy {100 * res.summary['acc']:.2f}% (embedding dim {emb.shape[1]})")
    fig = report.plot_tsne(tsne_2d(emb, seed=seed), groups, names,
                           f"t-SNE of pFedHN's client embeddings (Fig. 4), {data_label}, preset {preset}")
    save_figure(fig, session.figure("embeddings_tsne.png"))
    plt.show()
    display(Markdown(report.embedding_reading(measured, group)))
else:
    import matplotlib.pyplot as plt
    import numpy as np

    from pflkit.analysis.embeddings import embedding_report, tsne_2d
    from pflkit.report.figures import save_figure

    kept = committed.get("analysis", {}).get("pFedHN", {}).get("seeds", [])
    if kept and "embedding" in kept[0]:
        arrays = kept[0]
        emb = np.asarray(arrays["embedding"], dtype=float)
        group = "alphabet" if "alphabet" in arrays.get("groups", {}) else "class"
        if group == "alphabet":
            groups, names = np.asarray(arrays["groups"]["alphabet"]), arrays["group_names"]["alphabet"]
        else:  # one class per client (the digits stand-in): the class is the group
            groups = np.asarray([cls[0] for cls in arrays["classes"]])
            names = arrays.get("class_names") or [str(c) for c in range(int(groups.max()) + 1)]
        measured = embedding_report(emb, groups)
        print(f"pFedHN on {session.dataset_label(committed)}: {len(emb)} clients in {len(np.unique(groups))} "
              f"groups, embedding dim {emb.shape[1]} (the committed embeddings, 5 significant digits)")
        fig = report.plot_tsne(tsne_2d(emb, seed=seed), groups, names,
                               f"t-SNE of pFedHN's client embeddings (Fig. 4), {session.dataset_label(committed)}, "
                               f"preset {preset}", group=group)
        save_figure(fig, session.figure("embeddings_tsne.png"))
        plt.show()
        display(Markdown(report.embedding_reading(measured, group)))
    else:
        display(Markdown(f"The committed result of `{name}` keeps no embeddings (it predates `report_embeddings`): "
                         f"rerun it with `pflkit reproduce --only {name}`, or set `source=\"train\"` (training took "
                         f"the committed batch {session.training_time(name)})."))

# %% [markdown]
# ## Takeaways
# - The embeddings are the only client-specific input of the hypernetwork: whatever the hypernetwork shares
#   between two clients, it shares through how close their $v_i$ are.
# - Judge the structure by the numbers measured on the embeddings (nearest-neighbour agreement against chance,
#   silhouette), not by the picture: t-SNE can draw clusters from noise and hide real ones.
# - The paper's version is CIFAR-100 coarse classes; pflkit's is Omniglot alphabets at a reduced budget (the
#   experiment file explains the embedding learning rate it needs on a cpu budget), so compare the kind of
#   structure, not the picture.

# %% [markdown]
# ## Exercises
# 1. **Another seed.** Set `source = "train"`, `seed = 1`: does the nearest-neighbour agreement stay well above
#    chance? The reference is the reading under the figure in results mode (the committed embeddings).
# 2. **The stand-in.** Set `source = "train"`, `standin = True`: one digit per client. Are the groups easier to
#    separate than alphabets, and why (how different are the clients' label sets)?
# 3. **Smoke.** Set `preset = "smoke"`, `source = "train"`: with almost no training, how close to chance is
#    the agreement? It tells you what the untrained (random) embeddings give.
