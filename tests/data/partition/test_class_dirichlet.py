import numpy as np
import pytest

from pflkit.data.partition import (
    class_dirichlet, class_dirichlet_proportions, label_histogram, nearest_tv, total_variation,
)

RNG = np.random.default_rng(0)
Y = RNG.integers(0, 10, 6000)


def test_every_sample_once_and_counts_follow_p_hat():
    parts = class_dirichlet(Y, 25, alpha=0.3, seed=1)
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(Y.size))
    p_hat = class_dirichlet_proportions(Y, 25, alpha=0.3, seed=1)
    assert p_hat.shape == (25, 10)
    assert np.allclose(p_hat.sum(axis=0), 1.0)  # shares per class sum to 1 over clients
    h = label_histogram(Y, parts, 10)
    n_j = np.bincount(Y, minlength=10)
    assert np.abs(h - p_hat * n_j).max() <= 1.0


def test_p_hat_is_normalized_dirichlet_draw():
    # p_hat_{i,j} = p_{i,j} / sum_i p_{i,j} with p_i ~ Dir(alpha 1_K): recompute from the raw draws
    rng = np.random.default_rng(3)
    p = np.stack([rng.dirichlet(np.full(10, 0.5)) for _ in range(8)])
    expected = p / p.sum(axis=0, keepdims=True)
    assert np.allclose(class_dirichlet_proportions(Y, 8, alpha=0.5, seed=3), expected)


def test_per_client_alpha_for_novel_clients():
    alpha = [0.1] * 90 + [0.5] * 10
    y = np.repeat(np.arange(10), 300)
    parts = class_dirichlet(y, 100, alpha=alpha, seed=2)
    assert len(parts) == 100
    h = label_histogram(y, parts, 10) + 1e-9
    p = h / h.sum(1, keepdims=True)
    ent = -(p * np.log(p)).sum(1)
    assert ent[90:].mean() > ent[:90].mean()  # novel clients drawn with larger alpha are flatter


def test_paired_splits_use_same_shares():
    te = RNG.integers(0, 10, 2000)
    tr_parts, te_parts = class_dirichlet((Y, te), 12, alpha=0.2, seed=4)
    p_hat = class_dirichlet_proportions((Y, te), 12, alpha=0.2, seed=4)
    for y, parts in ((Y, tr_parts), (te, te_parts)):
        h = label_histogram(y, parts, 10)
        assert np.abs(h - p_hat * np.bincount(y, minlength=10)).max() <= 1.0


def test_determinism():
    a, b = class_dirichlet(Y, 5, alpha=1, seed=0), class_dirichlet(Y, 5, alpha=1, seed=0)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_total_variation_by_hand():
    assert total_variation([0.5, 0.5, 0.0], [0.2, 0.3, 0.5]) == pytest.approx(0.5)
    assert total_variation([1, 1, 0], [2, 3, 5]) == pytest.approx(0.5)  # counts are normalized
    assert total_variation([1, 0], [0, 1]) == pytest.approx(1.0)
    assert total_variation([3, 1], [6, 2]) == pytest.approx(0.0)


def test_nearest_tv_by_hand():
    novel = [[1.0, 0.0], [0.2, 0.8]]
    train = [[0.9, 0.1], [0.0, 1.0]]
    d, idx = nearest_tv(novel, train, return_index=True)
    assert np.allclose(d, [0.1, 0.2]) and list(idx) == [0, 1]
    assert np.allclose(nearest_tv(novel, train), [0.1, 0.2])


@pytest.mark.parametrize("p, q", [([1, -1], [1, 0]), ([0, 0], [1, 0]), ([1, 0, 0], [1, 0]),
                                  ([np.nan, 1], [1, 0])])
def test_total_variation_bad_input(p, q):
    with pytest.raises(ValueError):
        total_variation(p, q)


@pytest.mark.parametrize("alpha", [0, -0.5, float("inf"), [0.1] * 3])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        class_dirichlet(Y, 5, alpha=alpha, seed=0)
