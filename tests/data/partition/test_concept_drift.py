import numpy as np
import pytest

from pflkit.data.partition import concept_drift, concept_drift_choices

SUPER = np.arange(20) // 4  # 20 fine classes, 5 superclasses of 4 subclasses
Y = np.repeat(np.arange(20), 60)


@pytest.mark.parametrize("equal", [True, False])
def test_every_client_every_superclass_one_subclass(equal):
    parts = concept_drift(Y, 12, superclass=SUPER, seed=0, equal_marginals=equal)
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=0)
    assert choices.shape == (12, 5)
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size
    for p, row in zip(parts, choices):
        fine, sup = Y[p], SUPER[Y[p]]
        assert set(sup) == set(range(5))
        for s in range(5):  # one subclass per superclass, the one drawn
            assert set(fine[sup == s]) == {row[s]}
    if not equal:  # every sample of a drawn subclass is used, sizes vary
        assert allidx.size == np.isin(Y, np.unique(choices)).sum()


def test_label_marginals_equal_across_clients():
    parts = concept_drift(Y, 12, superclass=SUPER, seed=1)
    marg = np.stack([np.bincount(SUPER[Y[p]], minlength=5) / p.size for p in parts])
    assert np.allclose(marg, 0.2)
    counts = np.stack([np.bincount(SUPER[Y[p]], minlength=5) for p in parts])
    assert (counts == counts[:, :1]).all()  # same count of every superclass per client


def test_conditionals_differ_across_clients():
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=2)
    assert np.unique(choices, axis=0).shape[0] > 6
    for s in range(5):
        assert np.all(SUPER[choices[:, s]] == s)
        assert np.unique(choices[:, s]).size > 1


def test_split_evenly_among_holders():
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=3)
    parts = concept_drift(Y, 12, superclass=SUPER, seed=3, equal_marginals=False)
    holders = np.bincount(choices.ravel(), minlength=20)
    for p, row in zip(parts, choices):
        for c in row:
            got = np.count_nonzero(Y[p] == c)
            assert got in (60 // holders[c], -(-60 // holders[c]))


def test_paired_splits_share_choices():
    te = np.repeat(np.arange(20), 15)
    tr_p, te_p = concept_drift((Y, te), 8, superclass=SUPER, seed=4)
    for a, b in zip(tr_p, te_p):
        assert set(Y[a]) == set(te[b])


def test_determinism():
    a = concept_drift(Y, 10, superclass=SUPER, seed=5)
    b = concept_drift(Y, 10, superclass=SUPER, seed=5)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("sup, n, match", [
    (SUPER[:10], 5, "length 10"), (None, 5, "required"), (SUPER.astype(float), 5, "dtype float"),
    (np.r_[SUPER, 9], 5, "superclass 9 has no subclass"), (SUPER, 200, "clients drew it"),
    (SUPER, 0, "num_clients"),
])
def test_bad_arguments(sup, n, match):
    with pytest.raises(ValueError, match=match):
        concept_drift(Y, n, superclass=sup, seed=0)
