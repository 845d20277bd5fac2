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
# # FedL2P's analysis: Table 6, Fig. 3 / 5 and Fig. 2 / 4
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/pflkit/pflkit/blob/main/notebooks/fedl2p/05_analysis.ipynb)
#
# Do the meta-nets know the clients' domains (sec. 4.4)? For every client we have the meta-nets' inputs (BNNet's
# xi: how far its BN statistics are from the pretrained ones; LRNet's x: the mean and SD of every layer's input)
# and outputs (beta, eta). **Table 6** clusters the clients by each of them (spectral clustering of an RBF
# similarity of Euclidean distances, labels by discretization) and scores the clusters against the true domains
# with the adjusted Rand index: 1 = the domains, about 0 = chance. **Fig. 3 / 5** shows the normalized log
# distance between domains, `log(d(j, k) / sqrt(d(j, j) d(k, k)))`: off-diagonal blocks above 0 mean clients of
# different domains are farther apart than clients of the same domain. **Fig. 2 / 4** shows the learned beta and
# eta across clients and the sparsity per scenario.
#
# The run is `experiments/fedl2p/fedl2p_analysis_digits.toml` (MNIST / MNIST-M / USPS, 3 domains x 10 clients,
# Dir(0.5): the offline stand-in for DomainNet alpha = 0.5). Point `results_root` at a folder of runs
# (`<results_root>/<experiment>/`) to render them; label-shift and CIFAR-10-C runs found there join Fig. 2.

# %% tags=["install"]
# Colab / fresh machine: install pflkit once (skipped when it is already importable)
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("pflkit") is None:
    subprocess.run(["git", "clone", "--depth", "1", "https://github.com/pflkit/pflkit.git"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "pflkit"], check=True)
    sys.path.insert(0, "pflkit")

# %% tags=["parameters"]
preset = "cpu"
out_dir = "runs/fedl2p_analysis"
data_root = None
seed = 0
experiment = "fedl2p_analysis_digits"
results_root = None

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from pflkit.analysis.clustering import cluster_ari, report_matrix
from pflkit.data.base import DatasetNotFoundError
from pflkit.data.datasets import load_dataset
from pflkit.experiments import resolve
from pflkit.io import read_json
from pflkit.report.fedl2p import (
    PUBLISHED_ARI, ari_table, beta_summary, client_groups, load_report, plot_distance_map, plot_hyperparameters,
    plot_sparsity, report_path,
)
from pflkit.report.figures import save_figure
from pflkit.report.tables import format_table
from pflkit.runner import run_experiment

if preset == "smoke":
    torch.set_num_threads(1)  # tiny models on a shared CPU: one thread avoids oversubscription
out = Path(out_dir)
fig_dir = out / "figures" if preset == "smoke" else Path("../../figures/fedl2p")
shared = Path("../../../shared/data")
root = data_root or (str(shared) if shared.is_dir() else None)
cfg = resolve(experiment, preset, [f"seed={seed}"])
key = "corruption" if cfg.data.dataset == "cifar10c" else "domain"
try:
    names = load_dataset(cfg.data.dataset, root, **cfg.data.options).meta.group_names[key]
except DatasetNotFoundError:
    print(f"{cfg.data.dataset} not found: running the embedded digits demo, which has no domains; three arbitrary "
          "client groups stand in for them, so the ARIs below only show the pipeline (expect about 0)")
    cfg, key, names = resolve("demo", preset, [f"seed={seed}"]), None, None

# %% [markdown]
# ## 1. The run

# %%
run_dir = Path(results_root) / cfg.name if results_root else out / cfg.name
if not (results_root and (run_dir / "results.json").exists()):
    run_experiment(cfg, run_dir, data_root=root, progress=False)
results = read_json(run_dir / "results.json")
print(format_table(results))
report = load_report(run_dir, "FedL2P", seed)
domains = client_groups(run_dir, key, seed) if key is not None else np.arange(len(report)) % 3
print("clients per domain:", dict(zip(*np.unique(domains, return_counts=True))))

# %% [markdown]
# ## 2. Table 6: ARI of the meta-nets' inputs and outputs against the domains
# Published: DomainNet alpha = 0.5 (the role these digits play). Beside it, a check of the scale: the ARI of
# the same clustering applied to random features (about 0).

# %%
table = ari_table(report, domains, PUBLISHED_ARI[("DomainNet", 0.5)], seed=seed)
rng = np.random.default_rng(seed)
table["random features"] = [round(cluster_ari(rng.normal(size=report_matrix(report, q).shape), domains), 3)
                            for q in table["quantity"]]
table

# %% [markdown]
# ## 3. Fig. 3 / 5: normalized log distance maps between domains

# %%
fig, axes = plt.subplots(1, 4, figsize=(18, 3.8), gridspec_kw={"wspace": 0.5})
for ax, q in zip(axes, ("xi", "beta", "features", "eta")):
    plot_distance_map(report, domains, q, names=names, ax=ax, title=q)
fig.suptitle(f"{cfg.name}: log normalized distances (> 0 off the diagonal = domains apart)")
save_figure(fig, fig_dir / f"{cfg.name}_distance_maps.png")
plt.show()

# %% [markdown]
# ## 4. Fig. 2 / 4: learned hyperparameters and sparsity per scenario
# The paper: beta = 0 for every client on CIFAR-10 label shift (Fig. 2a), clearly above 0 on the domain
# datasets (Fig. 2b-d); sparsity high for label shift, 0 for the domains.

# %%
print("this run:", beta_summary(report))
fig = plot_hyperparameters(report, f"{cfg.name} (preset {preset})")
save_figure(fig, fig_dir / f"{cfg.name}_hyperparameters.png")
plt.show()

# %%
scenarios = {cfg.name.replace("fedl2p_", ""): report}
for path in sorted(Path(results_root).glob("fedl2p_table[23]_*")) if results_root else []:
    if path.name != cfg.name and report_path(path, "FedL2P", seed).exists():
        scenarios[path.name.replace("fedl2p_", "")] = load_report(path, "FedL2P", seed)
for label, rows in scenarios.items():
    s = beta_summary(rows)
    print(f"{label:28s} mean beta {s['mean']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}), "
          f"sparsity {s['sparsity']:.3f}")
ax = plot_sparsity(scenarios)
save_figure(ax.figure, fig_dir / "fedl2p_sparsity_by_scenario.png")
plt.show()
