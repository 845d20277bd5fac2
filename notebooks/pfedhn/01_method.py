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
# # pFedHN, step by step: a hypernetwork that writes every client's model
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/pfedhn/01_method.ipynb)
#
# Shamsian et al., *Personalized Federated Learning using Hypernetworks* (ICML 2021), sec. 3 and Alg. 1.
#
# **What you will learn**
# - what a hypernetwork is: a network on the server that maps a client's embedding $v_i$ to that client's
#   whole model $\theta_i$ (Eq. 3);
# - one step of Alg. 1 by hand: what travels (only the target network), what the client returns
#   ($\Delta\theta_i$) and how the server turns it into an update of the hypernetwork;
# - how a full pFedHN run trains (validation accuracy and bytes per server step), and how personal the
#   generated models are before any training, for each hypernetwork variant of the paper's ablations.
#
# **Prerequisites**: FedAvg (the [quickstart](../tutorials/00_quickstart.ipynb)); PyTorch autograd.
# **Next**: [02_tables](02_tables.ipynb) (Tables 1 and 2), [05_embeddings](05_embeddings.ipynb).
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) the training curves
# come from the committed run of Table 1's 10-client row in `results/cpu/`; sections 1, 2 and 4 build the
# hypernetwork and take one client step by hand (seconds, no training run). `source = "train"` also trains
# pFedHN for a few hundred steps here and plots that run instead.
#
# **Data and device.** CIFAR-10 is read from `data_root` or `$PFLKIT_DATA`, or downloaded with `download=True`
# (see `data/README.md`); without it sections 1, 2 and 4 say so in one line and the curves still show.
# `standin=True` runs sklearn's digits instead (a small MLP target), named as such in every title. Where
# pflkit's defaults differ from the paper: [docs/fidelity.md](../../docs/fidelity.md).

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
source = "results"  # results: the curves from the committed results (no training run); train: train here
out_dir = "runs/pfedhn_method"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one
download = True
standin = False
figures_dir = None  # None: out_dir/figures
seed = 0
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Markdown, display

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import hypernet as hn
from pflkit.fl.engines import nbytes
from pflkit.fl.federate import federation_for
from pflkit.fl.loop import run_rounds
from pflkit.models import count_params
from pflkit.notebooks.session import setup
from pflkit.report.pfedhn import figures as report
from pflkit.report.figures import OKABE_ITO, save_figure
from pflkit.run.environment import initial_model, make_env
from pflkit.run.stages import method_config

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
name = "pfedhn_table1_c10_n10"
session.run_times([name])
exp = session.resolve(name)
try:
    fed = federation_for(exp.data, session.load(exp.data.dataset, **exp.data.options), exp.seed)
except Exception as e:  # noqa: BLE001 - offline without the data: say so in one line, keep the curves
    fed = None
    print(f"{session.dataset_label(exp)} is not available here ({type(e).__name__}: {str(e)[:160]}); "
          "sections 1, 2 and 4 need it, section 3 does not")
if fed is not None:
    env = make_env(exp, fed, seed)
    display(Markdown(f"{session.dataset_label(exp)}, {fed.num_clients} clients with two classes each, model "
                     f"`{exp.model.name}`, device `{env.device}`; training samples per client: "
                     f"{', '.join(str(int(n)) for n in fed.sizes('train'))}."))

# %% [markdown]
# ## 1. The hypernetwork and the target network
# Personalized FL asks for one model per client, each good on its own data distribution $\mathcal{P}_i$
# (Eq. 1). pFedHN does not learn the $\theta_i$ directly: the server holds a hypernetwork $h(\cdot;\varphi)$ and
# one embedding $v_i$ per client, and the client's model is $\theta_i = h(v_i;\varphi)$. Both are learned
# (Eq. 3):
#
# $$\arg\min_{\varphi,\, v_1,\dots,v_n}\ \frac{1}{n}\sum_{i=1}^{n} \mathcal{L}_i\big(h(v_i;\varphi)\big). \tag{3}$$
#
# Here $h$ is a trunk of 3 hidden layers of 100 units and one linear head per target tensor; the embedding has
# $\lfloor 1 + n/4 \rfloor$ entries (App. C.2.2). The target is the authors' LeNet.

# %%
if fed is not None:
    algo, cfg = method_config(exp, "pFedHN")
    state = algo.init(initial_model(env), fed, cfg, env)
    net = hn.materialize(state["spec"], state["hnet"])
    target = env.model_fn()
    display(Markdown(
        f"The hypernetwork has **{count_params(net):,}** parameters (embedding dimension "
        f"{state['spec']['embed_dim']}); the target network **{count_params(target):,}** "
        f"({nbytes(dict(target.state_dict())) / 2**10:.1f} KiB per message). One head per target tensor: "
        + ", ".join(f"`{k}` {tuple(v)}" for k, v in state["spec"]["targets"].items()) + "."))

# %% [markdown]
# ## 2. One step of Alg. 1 by hand
# The server sends $\theta_i = h(v_i;\varphi)$ to client $i$; the client runs $K$ local SGD steps to
# $\tilde\theta_i$ and returns $\Delta\theta_i = \tilde\theta_i - \theta_i$. The server then updates $\varphi$
# (and $v_i$) with the vector-Jacobian product (sec. 3.2)
#
# $$\Delta\varphi = (\nabla_{\varphi}\theta_i)^{\top}\,\Delta\theta_i ,$$
#
# the gradient of the surrogate $\tfrac12\|\tilde\theta_i - h(v_i;\varphi)\|_2^2$ at the current $\varphi$: a
# step pulls the generated model towards what the client found. Below, one client does this once (one local
# update, not a training run), and we check that a small plain step of the server really shrinks the gap.

# %%
if fed is not None:
    cid = 0  # the Env is in round 0; run_rounds hands each round's phases env.at_round(t)
    msg = algo.broadcast(state, cid, cfg, env)                             # theta_i = h(v_i; phi)
    update, _ = algo.client_update(msg, fed.clients[cid], None, cfg, env)  # K local steps -> delta theta
    new_state = algo.aggregate(state, [update], cfg, env)                   # VJP through h, server SGD step
    delta = update.payload["delta"]
    tilde = {k: msg["theta"][k] + delta[k] for k in delta}

    def gap(s):
        theta = algo.broadcast(s, cid, cfg, env)["theta"]
        return sum(float(((tilde[k] - theta[k]) ** 2).sum()) for k in tilde) ** 0.5

    small = dataclasses.replace(cfg, server_lr=1e-4, server_momentum=0.0, server_weight_decay=0.0)
    before, after_small, after = gap(state), gap(algo.aggregate(state, [update], small, env)), gap(new_state)
    display(Markdown(
        f"Client {cid} ran {cfg.local_steps} local steps (last loss {update.metrics['loss']:.2f}): "
        f"$\\|\\Delta\\theta_i\\| = {before:.2f}$. A plain server step of rate $10^{{-4}}$ changes the gap "
        f"$\\|\\tilde\\theta_i - h(v_i;\\varphi)\\|$ by {100 * (after_small / before - 1):+.3f}% "
        f"({'smaller: a descent direction' if after_small < before else 'NOT smaller'}); the paper's step (rate "
        f"{cfg.server_lr}, momentum {cfg.server_momentum}) takes it to {after:.2f}"
        + (", an overshoot on one step: over many steps and clients the average direction is what counts."
           if after > before else ".")
        + f" Sent down {nbytes(msg):,} bytes, up {nbytes(update.payload):,}; the hypernetwork's "
        f"{nbytes(state['hnet']):,} bytes never travel."))

# %% [markdown]
# ## 3. Training: one client per server step
# `run_rounds` calls the same three phases; a pFedHN "round" is one server step with one sampled client (the
# paper's protocol), and validation every few steps keeps the best state. In results mode the curves are the
# committed run of Table 1's 10-client row; in train mode a shorter run made here.
#
# *Look for*: how many steps the validation accuracy takes to level off, and the two bars on the right (log
# scale): what a federated hypernetwork saves by never sending itself.

# %%
if source == "train":
    if fed is None:
        raise RuntimeError(f"source='train' needs {session.dataset_label(exp)}: see the line under the first cell")
    steps = 12 if preset == "smoke" else 300
    run = run_rounds(get_algorithm("pfedhn"),
                     method_config(exp, "pFedHN", rounds=steps, eval_every=max(1, steps // 10))[1],
                     fed, initial_model(env), env)
    history, what = run.history, f"{steps} steps trained here"
    display(Markdown(f"Test accuracy (mean over clients) {100 * run.summary['acc']:.2f}% at the best validation "
                     f"step, {run.best_round}."))
else:
    committed = session.run(name)
    history = next(iter(committed["rounds"]["pFedHN"].values()))
    what = f"the committed run, test accuracy {committed['methods']['pFedHN']['acc_mean']:.2f}%"
hnet_bytes = (nbytes(state["hnet"]) if fed is not None
              else 0)  # without the data the hypernetwork was not built: no reference line
fig = report.plot_training(history, hnet_bytes, f"pFedHN on {session.dataset_label(exp)}, preset {preset} ({what})")
save_figure(fig, session.figure("method_training.png"))
plt.show()
display(Markdown(report.training_reading(history, hnet_bytes)))

# %% [markdown]
# ## 4. How personal the generated models are before training
# Every head is $W z + b$: $b$ is the same for every client, only $W z$ depends on the client's embedding. At
# initialization the client-dependent part can be small next to the shared one; the hypernetwork then starts as
# nearly one model for everyone and has to learn its way to personal ones. `personal_share` measures it per
# target tensor, the mean over clients of $\|\theta_i - \bar\theta\| / \|\bar\theta\|$ with
# $\bar\theta = \frac1n\sum_j \theta_j$. Below, the hypernetwork of section 1 beside the variants of the paper's
# ablations: trunk depth (App. C.2.3), spectral normalization of every layer (App. C.3), and fixed
# class-proportion embeddings $\hat p_i$ instead of learned ones (App. C.5). Nothing is trained here.
#
# *Look for*: whether each added trunk layer shrinks the share, and where the two other variants fall.

# %%
if fed is not None:
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    from pflkit.algorithms.pfedhn import class_proportions
    from pflkit.analysis.pfedhn import personal_share

    targets, dim = state["spec"]["targets"], state["spec"]["embed_dim"]
    variants = {f"depth {d}": dict(embed_dim=dim, depth=d) for d in range(1, 6)}
    variants["depth 3, SN"] = dict(embed_dim=dim, spectral_norm=True)
    variants["depth 3, fixed p_hat"] = dict(fixed_embeddings=class_proportions(fed))
    share = {}
    for label, kwargs in variants.items():
        torch.manual_seed(seed)
        variant = hn.HyperNetwork(fed.num_clients, targets, **kwargs).eval()
        with torch.no_grad():
            per_tensor = personal_share([variant(i) for i in range(fed.num_clients)])
        share[label] = float(np.mean([v for k, v in per_tensor.items() if k.endswith("weight")]))
    kinds = {"trunk depth (App. C.2.3)": OKABE_ITO[0], "spectral normalization (App. C.3)": OKABE_ITO[1],
             "fixed embeddings p_hat (App. C.5)": OKABE_ITO[2]}
    colors = [OKABE_ITO[0]] * 5 + [OKABE_ITO[1], OKABE_ITO[2]]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.barh(list(share), list(share.values()), color=colors)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # major ticks only: the minor labels run into each other
    for y, value in enumerate(share.values()):
        ax.annotate(f"{value:.3f}", (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=9)
    ax.set_xlim(right=3 * max(share.values()))
    ax.invert_yaxis()
    ax.legend(handles=[Patch(color=c, label=k) for k, c in kinds.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    ax.set_xlabel("client-dependent / shared part of the generated weights at init (ratio, log scale)")
    ax.set_title(f"pFedHN at initialization, {fed.num_clients} clients of {session.dataset_label(exp)}")
    save_figure(fig, session.figure("method_personal_share.png"))
    plt.show()
    depths = [share[f"depth {d}"] for d in range(1, 6)]
    shrinks = all(a > b for a, b in zip(depths, depths[1:]))
    values = (" > " if shrinks else ", ").join(f"{v:.3f}" for v in depths)
    lines = [f"- Trunk depth 1 to 5: {values}: deeper trunks "
             + ("start less personal at every added layer." if shrinks else "do not shrink it at every layer.")]
    for label in ("depth 3, SN", "depth 3, fixed p_hat"):
        word = "less" if share[label] < share["depth 3"] else "not less"
        lines.append(f"- {label}: {word} personal than the plain hypernetwork ({share[label]:.3f} vs "
                     f"{share['depth 3']:.3f}).")
    display(Markdown("\n".join(lines)))

# %% [markdown]
# Why they can differ: at PyTorch's default initialization every extra trunk layer scales its input down,
# spectral normalization divides each head's $W z$ by the largest singular value of $W$ but leaves the shared
# biases alone, and class proportions (norm at most 1) are smaller inputs than $\mathcal{N}(0, 1)$ embeddings.
# Whether a hypernetwork that starts less personal also ends less accurate depends on the step budget: the
# findings under App. C.2.3, C.3 and C.5 in REPRODUCTION.md set these numbers beside the `cpu` runs.
#
# ## Takeaways
# - Only the target network travels: the hypernetwork can be much larger than the model it writes at no
#   communication cost (sections 1 and 3 give both sizes).
# - The server's update is the chain rule through $h$ applied to what the client moved; section 2 shows that a
#   small step of it is a descent direction for the gap to the client's result.
# - One client per server step: with many clients each one is visited rarely, so pFedHN needs many steps. The
#   reduced `cpu` preset gives it a fraction of the paper's 5,000 steps; [02_tables](02_tables.ipynb) says how
#   many and shows what that costs at 50 and 100 clients.
#
# ## Exercises
# 1. **Fewer local steps.** Set `source = "train"` and add `'methods."pFedHN".local_steps=1'` to
#    `session.resolve(name, ...)`: with $K = 1$ the update is a plain gradient. How much slower does the curve of
#    section 3 rise? The reference is the $K$ ablation, `results/cpu/pfedhn_ablation_local_steps.json` (App. C.2.1).
# 2. **A deeper trunk.** In section 4, which depth starts least personal? Compare with the committed depth
#    ablation `results/cpu/pfedhn_ablation_depth.json` (App. C.2.3): does the ordering of the final accuracies
#    follow the ordering at initialization?
# 3. **Another seed.** Set `seed = 1`: which of section 4's orderings survive a different initialization?
