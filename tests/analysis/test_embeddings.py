"""Embedding-structure numbers beside pFedHN Fig. 4, against hand computations."""
import numpy as np
import pytest

from pflkit.analysis.embeddings import (chance_agreement, embedding_report, neighbour_agreement, silhouette,
                                        tsne_2d)


def test_neighbour_agreement_by_hand():
    x = np.array([[0.0], [0.1], [1.0], [1.2], [5.0]])
    g = np.array([0, 0, 1, 0, 1])
    # nearest others: 1, 0, 3, 2, 3 -> same group for points 0, 1 only
    assert neighbour_agreement(x, g) == pytest.approx(2 / 5)
    # chance: (|g_i| - 1) / (n - 1) = (2, 2, 1, 2, 1) / 4, mean = 8 / 20
    assert chance_agreement(g) == pytest.approx(8 / 20)


def test_separated_groups_score_high_and_shuffled_groups_do_not():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 6)) * 10
    g = np.repeat(np.arange(4), 8)
    x = centers[g] + rng.normal(size=(32, 6))
    rep = embedding_report(x, g)
    assert rep["neighbour_agreement"] == 1.0 and rep["silhouette"] > 0.7
    shuffled = rng.permutation(g)
    assert neighbour_agreement(x, shuffled) < 0.6 and silhouette(x, shuffled) < 0.1
    xy = tsne_2d(x, seed=0)
    assert xy.shape == (32, 2) and neighbour_agreement(xy, g) == 1.0  # t-SNE keeps well separated groups apart


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one entry per embedding"):
        neighbour_agreement(np.zeros((3, 2)), [0, 1])
    with pytest.raises(ValueError, match="distinct groups"):
        silhouette(np.random.default_rng(0).normal(size=(4, 2)), [0, 0, 0, 0])
