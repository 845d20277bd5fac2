import numpy as np
import pytest

from pflkit.data.partition import iid


def check_disjoint(parts, n, full=True):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    assert np.unique(allidx).size == allidx.size, "a sample went to two clients"
    assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < n
    if full:
        assert allidx.size == n


def test_sizes_equal_and_cover():
    y = np.random.default_rng(0).integers(0, 5, 1003)
    parts = iid(y, 10, seed=1)
    check_disjoint(parts, y.size)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_label_distribution_close_to_global():
    y = np.random.default_rng(0).integers(0, 4, 8000)
    glob = np.bincount(y) / y.size
    for p in iid(y, 4, seed=3):
        assert 0.5 * np.abs(np.bincount(y[p], minlength=4) / p.size - glob).sum() < 0.05


def test_determinism_and_seed_dependence():
    y = np.arange(100) % 3
    a, b, c = iid(y, 5, seed=7), iid(y, 5, seed=7), iid(y, 5, seed=8)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_paired_returns_tuple():
    tr, te = np.arange(50) % 5, np.arange(20) % 5
    out = iid((tr, te), 4, seed=0)
    assert isinstance(out, tuple) and len(out) == 2
    check_disjoint(out[0], 50)
    check_disjoint(out[1], 20)


@pytest.mark.parametrize(
    "labels, num_clients, seed, err",
    [
        (np.zeros(5, int), 0, 0, ValueError),
        (np.zeros(5, int), 6, 0, ValueError),
        (np.zeros(5, int), True, 0, TypeError),
        (np.zeros(5, int), 2, None, TypeError),
        (np.zeros(5, int), 2, -1, ValueError),
        (np.zeros(5), 2, 0, TypeError),
        (np.zeros((5, 2), int), 2, 0, ValueError),
        (np.array([0, -1, 2]), 2, 0, ValueError),
        ((), 2, 0, ValueError),
    ],
)
def test_bad_arguments(labels, num_clients, seed, err):
    with pytest.raises(err):
        iid(labels, num_clients, seed=seed)
