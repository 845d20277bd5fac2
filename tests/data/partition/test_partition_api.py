import numpy as np
import pytest

from pflkit.data.partition import PARTITIONS, dirichlet, label_histogram, partition

Y = np.repeat(np.arange(8), 40)
META = {"domain": np.arange(Y.size) % 4}
OPTIONS = {
    "iid": {},
    "dirichlet": dict(alpha=0.5),
    "class_dirichlet": dict(alpha=0.5),
    "pathological": dict(classes_per_client=2),
    "shards": dict(classes_per_client=2, samples_per_class=10),
    "domains": dict(groups=META, alpha=1.0),
    "natural": dict(groups=META, key="domain"),
    "concept_drift": dict(superclass=np.arange(8) // 2),
}


def test_registry_lists_every_scheme():
    assert set(PARTITIONS) == set(OPTIONS)


@pytest.mark.parametrize("scheme", sorted(OPTIONS))
def test_every_scheme_deterministic_and_disjoint(scheme):
    a = partition(scheme, Y, 4, seed=3, **OPTIONS[scheme])
    b = partition(scheme, Y, 4, seed=3, **OPTIONS[scheme])
    assert len(a) == 4 and all(np.array_equal(u, v) for u, v in zip(a, b))
    allidx = np.concatenate(a)
    assert allidx.dtype == np.int64 and np.unique(allidx).size == allidx.size


def test_same_as_direct_call():
    a = partition("dirichlet", Y, 4, seed=1, alpha=0.3)
    b = dirichlet(Y, 4, alpha=0.3, seed=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_unknown_scheme_lists_known():
    with pytest.raises(ValueError, match="dirichlet"):
        partition("lda", Y, 4, seed=0)


def test_unknown_and_missing_options():
    with pytest.raises(TypeError, match="'beta'"):
        partition("dirichlet", Y, 4, seed=0, alpha=1.0, beta=2)
    with pytest.raises(TypeError, match="'alpha'"):
        partition("dirichlet", Y, 4, seed=0)


def test_label_histogram_by_hand():
    y = np.array([0, 1, 1, 2, 2, 2])
    h = label_histogram(y, [np.array([0, 1]), np.array([2, 3, 4, 5])], 4)
    assert np.array_equal(h, [[1, 1, 0, 0], [0, 1, 3, 0]])
    ht = label_histogram((y, y[:2]), ([np.array([5])], [np.array([1])]), 3)
    assert np.array_equal(ht[0], [[0, 0, 1]]) and np.array_equal(ht[1], [[0, 1, 0]])
    with pytest.raises(ValueError):
        label_histogram(y, [np.array([0])], 2)
