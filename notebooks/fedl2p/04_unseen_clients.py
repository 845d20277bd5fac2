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
# # FedL2P Table 4 (Lee et al., NeurIPS 2023): clients never seen in training
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/04_unseen_clients.ipynb)
#
# **What you will learn**
# - how FedL2P serves a client that took part in neither pretraining nor meta-learning: the meta-nets map its
#   data statistics to its own $\beta$ and $\eta$ in one forward pass;
# - how to compare a *seen* pool of clients with an *unseen* one, method by method (Table 4);
# - why fine-tuning with the pretrained BN statistics (FT (BN G)) can fail on new speakers.
#
# **Prerequisites**: [the method](01_method.ipynb) and [domains](03_domains.ipynb). **Next**:
# [Table 6, the analysis](05_analysis.ipynb).
#
# **Run time**: the table under the first code cell. By default (`source = "results"`) every table and figure is
# drawn from the committed result `results/cpu/<experiment>.json`, nothing trains; `source = "train"` trains it
# here, with progress bars. Where pflkit's defaults differ from the papers: the fidelity ledger,
# [docs/fidelity.md](../../docs/fidelity.md).
#
# ## The setting
# Speech Commands is partitioned by speaker (sec. 4.3): one client per speaker. The global model $\theta_g$ and
# the meta-nets $\lambda$ are learned on the seen pool $S$ only (Eq. 5 with its sum over $i \in S$):
# $$\min_\lambda \sum_{i \in S} \frac{N_i}{\sum_{i' \in S} N_{i'}}\, \mathcal L_{i,V}\big(\theta_i^*(\lambda), \lambda\big).$$
# An unseen client $u \notin S$ then gets $\boldsymbol\beta_u = \mathrm{BNNet}(w_{bn}; \xi_{u,1}, \dots, \xi_{u,B})$
# and $\boldsymbol\eta_u$ from LRNet (Eq. 4), is fine-tuned with them and tested like the others.
#
# Offline, the Free Spoken Digit Dataset (FSDD) plays this role: six speakers, one client each, four seen and
# two unseen (`pflkit/catalog/fedl2p/fedl2p_table4_fsdd_e5.toml`; the Speech Commands rows are
# `fedl2p_table4_speech_commands_e*`). The runner reports the unseen pool in
# `results["methods"][label]["unseen"]`; `acc_mean` is over the seen pool.

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
out_dir = "runs/fedl2p_unseen"
data_root = None  # a folder with datasets; else $PFLKIT_DATA, then the cache
device = "auto"  # auto: the GPU when there is one, e.g. a Colab GPU runtime
download = True  # fetch missing datasets, never when PFLKIT_OFFLINE is set
standin = False  # True: sklearn digits replace every other dataset, labelled STAND-IN
figures_dir = None  # None: out_dir/figures; `pflkit notebooks --figures` writes the repository's figures/
seed = 0
seeds = 1
speech = "fsdd"  # fsdd, offline, or speech_commands
epochs = 5  # 5 or 15
results_root = None  # train mode: a folder of saved runs (<results_root>/<experiment>/) to read instead
results_dir = None  # results mode: the committed results' folder (None: the checkout's results/)

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from pflkit.notebooks.session import setup
from pflkit.report import readings
from pflkit.report.fedl2p.figures import versus_finetuning
from pflkit.report.fedl2p.learned import drawable, learned, learned_reading, paper_label, plot_learned
from pflkit.report.figures import OKABE_ITO, save_figure

session = setup(preset, out_dir, data_root=data_root, device=device, download=download, standin=standin,
                figures_dir=figures_dir, seed=seed, source=source, results_dir=results_dir)
name = f"fedl2p_table4_{speech}_e{epochs}"
overrides = [] if seeds == session.resolve(name).seeds else [f"seeds={seeds}"]  # the committed row's seeds: none
cfg = session.resolve(name, *overrides)
display(Markdown(f"**{name}**: {cfg.title}, on {session.dataset_label(cfg)}"))
session.run_times([name])

# %% [markdown]
# ## 1. Seen and unseen pools
# *Look for*: the gap between each method's two bars. A method whose unseen bar falls far below its seen bar
# does not carry over to new speakers.

# %%
results = session.run(name, *overrides, results_root=results_root)
run_dir = session.run_dir(name, results_root)
data_label, paper = session.dataset_label(results), paper_label(results, session.paper_header(results))
published = results["config"]["published"]
rows = []
for label, m in results["methods"].items():
    unseen = (m.get("unseen") or {}).get("acc_mean")
    rows.append({"method": label, "seen (%)": m["acc_mean"], "paper: seen": published.get(label),
                 "unseen (%)": unseen, "paper: unseen": published.get(f"{label} (unseen)")})
table = pd.DataFrame(rows).set_index("method").astype(float)
display(Markdown(f"{name} on {data_label}, preset {preset}: mean over clients of the per-client test accuracy; "
                 f"the `paper` columns are the {paper}"))
display(table.round(2))

fig, ax = plt.subplots(figsize=(8, 3.8))
x = np.arange(len(table))
for k, (col, shift) in enumerate([("seen (%)", -0.2), ("unseen (%)", 0.2)]):
    bars = ax.bar(x + shift, table[col], 0.4, color=OKABE_ITO[k], label=f"pflkit, {col.split(' ')[0]} clients")
    ax.bar_label(bars, labels=["—" if np.isnan(v) else f"{v:.0f}" for v in table[col]], padding=2, fontsize=8)
for k, (col, shift) in enumerate([("paper: seen", -0.2), ("paper: unseen", 0.2)]):
    ax.plot(x + shift, table[col], "D" if k == 0 else "s", color="black", markersize=5, linestyle="none",
            label=f"{paper}, {col.split(' ')[1]} clients")
ax.set_xticks(x, table.index, rotation=20, ha="right")
ax.set_ylim(0, 110)
ax.set_ylabel("personalized test accuracy (%)")
ax.set_title(f"{name} ({data_label}): seen against unseen clients")
ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
save_figure(fig, session.figure(f"{name}_pools.png"))
plt.show()
seen_vs, unseen_vs = versus_finetuning(results), versus_finetuning(results, pool="unseen")
gap = (table["seen (%)"] - table["unseen (%)"]).dropna()
display(Markdown(
    f"Seen minus unseen, in points: " + ", ".join(f"{k} {v:+.1f}" for k, v in gap.items()) + ". "
    + (f"FedL2P against the best FT baseline: {readings.signed(seen_vs['gain'])} points on the seen pool "
       f"({seen_vs['best_ft_label']}), " if seen_vs["gain"] is not None else "")
    + (f"{readings.signed(unseen_vs['gain'])} on the unseen pool ({unseen_vs['best_ft_label']})."
       if unseen_vs["gain"] is not None else "")))

# %% [markdown]
# ## 2. The hyperparameters the meta-nets give every client, seen or not
# The compact result stores each client's mean $\beta$ and sparsity, unseen clients included. The paper finds
# a mix of pretrained and client BN statistics for new speakers (App. F).
#
# *Look for*: whether the clients get different $\beta$ (per-client dots) or one shared value (stated).

# %%
summary = learned(results, "FedL2P", seed, run_dir)
if drawable(summary):
    fig = plot_learned(summary, f"{name} ({data_label}): FedL2P, every client (preset {preset})")
    save_figure(fig, session.figure(f"{name}_hyperparameters.png"))
    plt.show()
display(Markdown(learned_reading(summary)))

# %% [markdown]
# ## Takeaways
# Generated from the paper's claims that pflkit checks (`pflkit.report.claims`) on this row, and from the
# results above.

# %%
claims = session.checked_claims("fedl2p", [name], results_root)
checked = [c for c in claims if c.verdict != "not run"]
lines = [readings.takeaways(checked, preset)]
if "FT (BN G)" in table.index and "FedL2P" in table.index:
    g, f = table.loc["FT (BN G)"], table.loc["FedL2P"]
    lines.append(f"- FT (BN G) on the unseen pool: {g['unseen (%)']:.1f}% ({paper}: {g['paper: unseen']:.1f}%); "
                 f"FedL2P {f['unseen (%)']:.1f}% ({paper}: {f['paper: unseen']:.1f}%). "
                 + ("Keeping the pretrained BN statistics fails on new speakers here too."
                    if g["unseen (%)"] < f["unseen (%)"] - 10 else
                    "The paper's collapse of FT (BN G) on new speakers does not show on this small offline stand-in."))
lines.append(f"- {len(results['methods']['FedL2P']['per_client'][0])} clients, one seed, at preset `{preset}`: "
             "a few points are within the noise (the README's noise paragraph).")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. **Longer fine-tuning.** Set `epochs = 15` (results mode). Does the seen/unseen gap shrink for the FT
#    baselines? Reference: `results/cpu/fedl2p_table4_fsdd_e15.json`.
# 2. **More unseen speakers.** Set `source = "train"` and add the override `"data.unseen_clients=3"` to
#    `session.run(name, ...)`: the meta-nets learn from three speakers. Compare the unseen column with the one above.
# 3. **Speech Commands.** With the dataset available, `speech = "speech_commands"` and `source = "train"` run the
#    paper's own data (hours on a CPU; `preset = "paper"` is for a GPU).
