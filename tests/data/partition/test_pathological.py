import numpy as np
import pytest

from pflkit.data.partition import label_histogram, pathological, pathological_shares

Y = np.repeat(np.arange(10), 600)


@pytest.mark.parametrize("num_clients, k", [(10, 2), (50, 2), (13, 3), (7, 10), (3, 2)])
def test_k_classes_each_balanced_use(num_clients, k):
    parts = pathological(Y, num_clients, classes_per_client=k, seed=num_clients)
    h = label_histogram(Y, parts, 10)
    assert ((h > 0).sum(axis=1) == k).all()
    uses = (h > 0).sum(axis=0)
    assert uses.max() - uses.min() <= 1 and uses.sum() == num_clients * k
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size
    # every sample of a used class is assigned
    assert allidx.size == np.bincount(Y, minlength=10)[uses > 0].sum()


def test_counts_follow_shares_and_share_bounds():
    low, high = 0.4, 0.6
    parts = pathological(Y, 50, classes_per_client=2, seed=3, low=low, high=high)
    s = pathological_shares(Y, 50, classes_per_client=2, seed=3, low=low, high=high)
    h = label_histogram(Y, parts, 10)
    assert np.abs(h - s * 600).max() <= 1.0
    assert np.allclose(s.sum(axis=0), 1.0)
    m = (s > 0).sum(axis=0)  # clients holding each class
    lo = low / (low + (m - 1) * high)
    hi = high / (high + (m - 1) * low)
    held = s > 0
    assert (s[held] >= np.broadcast_to(lo, s.shape)[held] - 1e-12).all()
    assert (s[held] <= np.broadcast_to(hi, s.shape)[held] + 1e-12).all()
    assert (h[~held] == 0).all()


def test_unused_classes_when_few_clients():
    parts = pathological(Y, 3, classes_per_client=2, seed=0)
    h = label_histogram(Y, parts, 10)
    assert ((h > 0).sum(0) <= 1).all() and ((h > 0).sum(0) == 1).sum() == 6


def test_paired_splits_same_classes_and_shares():
    te = np.repeat(np.arange(10), 100)
    tr_p, te_p = pathological((Y, te), 20, classes_per_client=3, seed=8)
    s = pathological_shares((Y, te), 20, classes_per_client=3, seed=8)
    htr, hte = label_histogram(Y, tr_p, 10), label_histogram(te, te_p, 10)
    assert np.array_equal(htr > 0, hte > 0)
    assert np.abs(hte - s * 100).max() <= 1.0


def test_determinism():
    a = pathological(Y, 10, classes_per_client=2, seed=1)
    b = pathological(Y, 10, classes_per_client=2, seed=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("kw", [dict(classes_per_client=11), dict(classes_per_client=0),
                                dict(classes_per_client=2, low=0.7, high=0.6),
                                dict(classes_per_client=2, low=0.0),
                                dict(classes_per_client=2, high=float("inf"))])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        pathological(Y, 10, seed=0, **kw)


def test_greedy_balance_never_gets_stuck():
    from pflkit.data.partition._common import balanced_classes

    rng = np.random.default_rng(0)
    classes = np.arange(7)
    for num_clients in range(1, 25):
        for k in range(1, 8):
            chosen = balanced_classes(num_clients, k, classes, rng)
            assert all(np.unique(r).size == k for r in chosen)
            uses = np.bincount(chosen.ravel(), minlength=7)
            assert uses.max() - uses.min() <= 1
