"""Client embeddings and what they say about the clients (pFedHN Fig. 4, sec. 5.5).

pFedHN learns one embedding v_i per client. Fig. 4 projects them to 2-D with
t-SNE and colours them by a known group (the CIFAR-100 coarse class each client
was built from; offline, the Omniglot alphabet). A picture is not a measurement,
so beside it we report two numbers computed on the embeddings themselves (not on
the 2-D projection):

* `neighbour_agreement`: share of clients whose nearest other client (Euclidean)
  is in the same group (leave-one-out 1-NN accuracy; chance is about the share
  of same-group pairs, `chance_agreement`);
* `silhouette`: scikit-learn's mean silhouette coefficient of the groups (1 =
  tight separated groups, 0 = overlapping, < 0 = mixed).
"""
from __future__ import annotations

import numpy as np


def _check(emb, groups) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(emb, dtype=np.float64)
    g = np.asarray(groups)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"embeddings must be (n >= 2, d), got shape {x.shape}")
    if g.shape != (x.shape[0],):
        raise ValueError(f"groups must have one entry per embedding ({x.shape[0]}), got shape {g.shape}")
    if not np.isfinite(x).all():
        raise ValueError("embeddings contain non-finite values")
    return x, g


def neighbour_agreement(emb, groups) -> float:
    """Share of points whose nearest other point has the same group (leave-one-out 1-NN)."""
    x, g = _check(emb, groups)
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return float((g[d.argmin(1)] == g).mean())


def chance_agreement(groups) -> float:
    """Expected `neighbour_agreement` of a random neighbour: mean over i of (|g_i| - 1) / (n - 1)."""
    g = np.asarray(groups)
    _, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
    return float(((counts[inverse] - 1) / (len(g) - 1)).mean())


def silhouette(emb, groups) -> float:
    """Mean silhouette coefficient of the groups (scikit-learn), Euclidean."""
    from sklearn.metrics import silhouette_score

    x, g = _check(emb, groups)
    if len(np.unique(g)) < 2 or len(np.unique(g)) >= len(g):
        raise ValueError("silhouette needs between 2 and n - 1 distinct groups")
    return float(silhouette_score(x, g))


def tsne_2d(emb, *, seed: int = 0, perplexity: float | None = None) -> np.ndarray:
    """t-SNE projection to 2-D (scikit-learn); perplexity defaults to min(30, (n - 1) / 3)."""
    from sklearn.manifold import TSNE

    x = np.asarray(emb, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 3:
        raise ValueError(f"t-SNE needs (n >= 3, d) embeddings, got shape {x.shape}")
    p = perplexity if perplexity is not None else max(1.0, min(30.0, (x.shape[0] - 1) / 3))
    return TSNE(n_components=2, perplexity=p, init="pca", random_state=seed).fit_transform(x)


def embedding_report(emb, groups) -> dict[str, float]:
    """The numbers printed beside Fig. 4."""
    return {"neighbour_agreement": neighbour_agreement(emb, groups), "chance": chance_agreement(groups),
            "silhouette": silhouette(emb, groups)}


def plot_embeddings(xy, groups, names=None, ax=None, title: str | None = None):
    """Scatter of 2-D points coloured by group; ``names`` label the groups in the legend."""
    import matplotlib.pyplot as plt

    xy, g = np.asarray(xy), np.asarray(groups)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4.5))
    cmap = plt.get_cmap("tab20" if len(np.unique(g)) > 10 else "tab10")
    for k, grp in enumerate(np.unique(g)):
        sel = g == grp
        label = names[grp] if names is not None else str(grp)
        ax.scatter(xy[sel, 0], xy[sel, 1], s=40, color=cmap(k % cmap.N), label=label, edgecolor="k", linewidth=0.3)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=7, loc="best", frameon=False)
    if title:
        ax.set_title(title)
    return ax
