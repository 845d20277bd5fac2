import numpy as np
import pytest

from pflkit.data.partition import domain_assignment, domains, label_histogram

RNG = np.random.default_rng(0)
DOM = np.repeat([0, 1, 2], [900, 1200, 1500])
Y = RNG.integers(0, 10, DOM.size)
G = {"domain": DOM}


def entropy(h):
    p = h / h.sum(1, keepdims=True)
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(1)


@pytest.mark.parametrize("alpha", [None, 0.1])
def test_clients_never_mix_domains(alpha):
    parts = domains(Y, 12, groups=G, seed=0, alpha=alpha)
    assign = domain_assignment(Y, 12, groups=G)
    assert list(assign) == [0] * 4 + [1] * 4 + [2] * 4
    for p, d in zip(parts, assign):
        assert p.size > 0 and (DOM[p] == d).all()
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size
    sizes = np.array([p.size for p in parts]).reshape(3, 4)  # N_domain / clients per domain
    assert np.array_equal(sizes, [[225] * 4, [300] * 4, [375] * 4])


def test_dirichlet_skew_inside_domain():
    iid_h = label_histogram(Y, domains(Y, 12, groups=G, seed=1), 10)
    skew_h = label_histogram(Y, domains(Y, 12, groups=G, seed=1, alpha=0.1), 10)
    assert entropy(skew_h).mean() < entropy(iid_h).mean() - 0.5


def test_one_client_per_domain_and_equalize():
    parts = domains(Y, 3, groups=G, seed=0)
    for d, p in enumerate(parts):
        assert np.array_equal(p, np.flatnonzero(DOM == d))
    eq = domains(Y, 3, groups=G, seed=0, equalize=True)
    assert [p.size for p in eq] == [900, 900, 900]
    assert all((DOM[p] == d).all() for d, p in enumerate(eq))


def test_custom_key_and_paired_splits():
    dom_te = np.repeat([0, 1, 2], [100, 200, 300])
    y_te = RNG.integers(0, 10, dom_te.size)
    tr, te = domains((Y, y_te), 6, groups=({"corr": DOM}, {"corr": dom_te}), key="corr",
                     seed=2, alpha=0.2)
    for parts, dom in ((tr, DOM), (te, dom_te)):
        for i, p in enumerate(parts):
            assert (dom[p] == i // 2).all()
    # same proportions q for a client's train and test split: histograms agree far better
    # than with another client of the same domain
    htr, hte = label_histogram(Y, tr, 10), label_histogram(y_te, te, 10)
    tv = lambda a, b: 0.5 * np.abs(a / a.sum() - b / b.sum()).sum()  # noqa: E731
    same = np.mean([tv(htr[i], hte[i]) for i in (0, 2, 4)])
    other = np.mean([tv(htr[i], hte[i + 1]) for i in (0, 2, 4)])
    assert same < other


def test_determinism():
    a, b = domains(Y, 6, groups=G, seed=3, alpha=1), domains(Y, 6, groups=G, seed=3, alpha=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("kw, match", [
    (dict(groups=G, num_clients=7), "not divisible"), (dict(groups={"x": DOM}), "no key 'domain'"),
    (dict(groups={"domain": DOM[:-1]}), "3599 entries"), (dict(groups=None), "required"),
    (dict(groups=G, alpha=0), "alpha"), (dict(groups=(G, G)), "2 dicts"),
])
def test_bad_arguments(kw, match):
    n = kw.pop("num_clients", 6)
    with pytest.raises(ValueError, match=match):
        domains(Y, n, seed=0, **kw)


def test_domain_smaller_than_its_clients():
    dom = np.array([0] * 3 + [1] * 50)
    with pytest.raises(ValueError, match="domain 0 has 3 samples"):
        domains(np.zeros(53, int), 10, groups={"domain": dom}, seed=0)
