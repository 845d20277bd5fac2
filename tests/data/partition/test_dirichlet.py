import numpy as np
import pytest

from pflkit.data.partition import dirichlet, dirichlet_proportions, label_histogram


def entropy(h):
    p = h / h.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)


def tv(p, q):
    return 0.5 * np.abs(p / p.sum(-1, keepdims=True) - q / q.sum(-1, keepdims=True)).sum(-1)


Y = np.repeat(np.arange(10), 1000)  # 10 balanced classes, 10k samples


def test_equal_sizes_disjoint():
    parts = dirichlet(Y, 20, alpha=0.1, seed=0)
    assert [p.size for p in parts] == [500] * 20
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size == 10000
    parts = dirichlet(Y, 20, alpha=0.5, seed=0, samples_per_client=123)
    assert [p.size for p in parts] == [123] * 20


def test_concentration_trend_and_iid_limit():
    means = []
    for alpha in (0.1, 1.0, 1000.0):
        h = label_histogram(Y, dirichlet(Y, 20, alpha=alpha, seed=1), 10)
        means.append(entropy(h).mean())
    assert means[0] < means[1] < means[2]
    h = label_histogram(Y, dirichlet(Y, 20, alpha=1000, seed=1), 10)
    d = tv(h, np.full(10, 0.1))
    # multinomial noise of 500 draws; the last client takes whatever is left, so it drifts more
    assert d[:-1].max() < 0.12 and np.median(d) < 0.08 and d[-1] < 0.3


def test_first_client_follows_its_proportions():
    # Nothing is exhausted while client 0 is filled, so its counts ~ Multinomial(500, q_0).
    q = dirichlet_proportions(Y, 20, alpha=1.0, seed=4)
    h = label_histogram(Y, dirichlet(Y, 20, alpha=1.0, seed=4), 10)
    assert np.allclose(q.sum(1), 1)
    assert tv(h[0], q[0]) < 0.08
    # and far from another client's proportions
    assert tv(h[0], q[1]) > tv(h[0], q[0]) + 0.1


def test_exhausted_class_is_renormalized_away():
    y = np.array([0] * 900 + [1] * 100)
    parts = dirichlet(y, 10, alpha=1000, seed=0)
    h = label_histogram(y, parts, 2)
    assert (h.sum(1) == 100).all() and (h.sum(0) == [900, 100]).all()
    # class 1 (100 samples) runs out after ~2 clients taking half their data from it
    assert h[0, 1] > 30 and (h[3:, 1] == 0).all()


def test_per_client_alpha():
    alpha = [1000.0] * 5 + [0.01] * 5
    q = dirichlet_proportions(Y, 10, alpha=alpha, seed=2)
    assert q[:5].max() < 0.2 and (q[5:].max(1) > 0.8).all()
    parts = dirichlet(Y, 10, alpha=alpha, seed=2)
    assert entropy(label_histogram(Y, parts, 10)[:5]).min() > 2.0


def test_paired_splits_share_proportions():
    te = np.repeat(np.arange(10), 400)
    tr_parts, te_parts = dirichlet((Y, te), 10, alpha=0.3, seed=5)
    assert [p.size for p in te_parts] == [400] * 10
    htr, hte = label_histogram(Y, tr_parts, 10), label_histogram(te, te_parts, 10)
    # first clients (no exhaustion yet): test histogram matches train histogram
    assert tv(htr[:3], hte[:3]).max() < 0.1
    cross = np.mean([tv(htr[i], htr[j]) for i in range(3) for j in range(3) if i != j])
    assert cross > 0.3
    tr2, te2 = dirichlet((Y, te), 10, alpha=0.3, seed=5, samples_per_client=(100, 30))
    assert [p.size for p in te2] == [30] * 10 and [p.size for p in tr2] == [100] * 10


def test_determinism():
    a, b = dirichlet(Y, 7, alpha=0.5, seed=9), dirichlet(Y, 7, alpha=0.5, seed=9)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    c = dirichlet(Y, 7, alpha=0.5, seed=10)
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


@pytest.mark.parametrize(
    "kw",
    [dict(alpha=0), dict(alpha=-1), dict(alpha=float("nan")), dict(alpha=float("inf")),
     dict(alpha=[1.0, 2.0]), dict(alpha=1.0, samples_per_client=2000),
     dict(alpha=1.0, samples_per_client=0), dict(alpha=1.0, samples_per_client=(10, 10))],
)
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        dirichlet(Y, 10, seed=0, **kw)
