"""Concept drift (pFedVEM sec. 3.1): pflkit's earlier scheme (sizes="even", group_size=1, kept as an
option) in the first tests, then the default, the authors' split, against its definitions."""
import numpy as np
import pytest

from pflkit.data.partition import concept_drift, concept_drift_choices
from pflkit.data.partition.concept_drift import spacing_sizes, uniform_sizes

SUPER = np.arange(20) // 4  # 20 fine classes, 5 superclasses of 4 subclasses
Y = np.repeat(np.arange(20), 60)
OLD = dict(sizes="even", group_size=1, test="split")  # pflkit's earlier scheme


@pytest.mark.parametrize("equal", [True, False])
def test_every_client_every_superclass_one_subclass(equal):
    parts = concept_drift(Y, 12, superclass=SUPER, seed=0, equal_marginals=equal, **OLD)
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=0, **OLD)
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
    parts = concept_drift(Y, 12, superclass=SUPER, seed=1, **OLD)
    marg = np.stack([np.bincount(SUPER[Y[p]], minlength=5) / p.size for p in parts])
    assert np.allclose(marg, 0.2)
    counts = np.stack([np.bincount(SUPER[Y[p]], minlength=5) for p in parts])
    assert (counts == counts[:, :1]).all()  # same count of every superclass per client


def test_conditionals_differ_across_clients():
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=2, **OLD)
    assert np.unique(choices, axis=0).shape[0] > 6
    for s in range(5):
        assert np.all(SUPER[choices[:, s]] == s)
        assert np.unique(choices[:, s]).size > 1


def test_split_evenly_among_holders():
    choices = concept_drift_choices(Y, 12, superclass=SUPER, seed=3, **OLD)
    parts = concept_drift(Y, 12, superclass=SUPER, seed=3, equal_marginals=False, **OLD)
    holders = np.bincount(choices.ravel(), minlength=20)
    for p, row in zip(parts, choices):
        for c in row:
            got = np.count_nonzero(Y[p] == c)
            assert got in (60 // holders[c], -(-60 // holders[c]))


def test_paired_splits_share_choices():
    te = np.repeat(np.arange(20), 15)
    tr_p, te_p = concept_drift((Y, te), 8, superclass=SUPER, seed=4, **OLD)
    for a, b in zip(tr_p, te_p):
        assert set(Y[a]) == set(te[b])


@pytest.mark.parametrize("opts", [OLD, {}, dict(sizes="uniform", max_per_superclass=20, group_size=1)])
def test_determinism(opts):
    a = concept_drift(Y, 10, superclass=SUPER, seed=5, **opts)
    b = concept_drift(Y, 10, superclass=SUPER, seed=5, **opts)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("sup, n, match", [
    (SUPER[:10], 5, "length 10"), (None, 5, "required"), (SUPER.astype(float), 5, "dtype float"),
    (np.r_[SUPER, 9], 5, "superclass 9 has no subclass"), (SUPER, 200, "clients drew it"),
    (SUPER, 0, "num_clients"),
])
def test_bad_arguments(sup, n, match):
    with pytest.raises(ValueError, match=match):
        concept_drift(Y, n, superclass=sup, seed=0, **OLD)


# ---------------------------------------------------------------- the default: the authors' split


def _cifar100_like(per_class=50, test_per_class=10, n_super=4):
    """n_super superclasses of 5 subclasses each, equal class sizes (CIFAR-100's shape, smaller)."""
    sup = np.arange(5 * n_super) // 5
    return sup, np.repeat(np.arange(sup.size), per_class), np.repeat(np.arange(sup.size), test_per_class)


def test_authors_split_uses_every_sample_once_so_the_mean_size_is_n_over_j():
    sup, y, yt = _cifar100_like()
    for j in (5, 10, 20):  # K = 1, 2, 4 groups of 5
        tr, _ = concept_drift((y, yt), j, superclass=sup, seed=j)
        everything = np.concatenate(tr)
        assert np.array_equal(np.sort(everything), np.arange(y.size))  # a partition of the train split
        assert np.mean([p.size for p in tr]) == y.size / j  # Table 1's "expected data size" N / J


def test_expected_size_of_one_client_over_seeds_is_n_over_j():
    sup, y, _ = _cifar100_like()
    sizes = [concept_drift(y, 20, superclass=sup, seed=s)[0].size for s in range(150)]
    # client 0's size is 4 superclasses x group 0's piece of 50 (K = 4): mean 50, sd about 0.19 * 4 * 50
    assert abs(np.mean(sizes) - y.size / 20) < 4 * np.std(sizes) / np.sqrt(len(sizes))
    assert np.std(sizes) > 5  # sizes vary ("random sampling without replacement")


def test_groups_of_five_hold_distinct_subclasses_and_equal_sizes():
    sup, y, yt = _cifar100_like()
    choices = concept_drift_choices((y, yt), 20, superclass=sup, seed=3)
    tr, _ = concept_drift((y, yt), 20, superclass=sup, seed=3)
    for g in range(4):
        block = choices[5 * g:5 * g + 5]
        for s in range(4):  # each superclass's 5 subclasses, one per client of the group (a permutation)
            assert sorted(block[:, s]) == list(range(5 * s, 5 * s + 5))
        assert len({tr[i].size for i in range(5 * g, 5 * g + 5)}) == 1  # the group's piece, on every client
    assert len({p.size for p in tr}) > 1


def test_each_client_superclass_marginal_is_uniform_and_test_is_shared():
    sup, y, yt = _cifar100_like()
    tr, te = concept_drift((y, yt), 10, superclass=sup, seed=4)
    choices = concept_drift_choices((y, yt), 10, superclass=sup, seed=4)
    for p, q, row in zip(tr, te, choices):
        counts = np.bincount(sup[y[p]], minlength=4)
        assert (counts == counts[0]).all() and counts[0] > 0  # P_j(y) uniform (Definition 2.1)
        for s in range(4):  # one subclass per superclass, the one drawn
            assert set(y[p][sup[y[p]] == s]) == {row[s]}
        assert np.array_equal(np.sort(q), np.flatnonzero(np.isin(yt, row)))  # every test sample of its subclasses


def test_split_test_follows_the_train_shares():
    sup, y, yt = _cifar100_like(test_per_class=20)
    tr, te = concept_drift((y, yt), 10, superclass=sup, seed=5, test="split")
    assert np.unique(np.concatenate(te)).size == sum(q.size for q in te) == yt.size  # disjoint, all used
    for p, q in zip(tr, te):
        assert set(y[p]) == set(yt[q])


def test_spacing_sizes_by_definition():
    rng = np.random.default_rng(0)
    t = spacing_sizes(rng, 23, 5, 500)  # 5 groups, the last of 3 clients
    pieces = t[::5]
    assert pieces.sum() == 500 and pieces.min() >= 1 and len(set(pieces.tolist())) == 5
    assert all((t[5 * g:5 * g + 5] == pieces[g]).all() for g in range(5))
    with pytest.raises(ValueError, match="use fewer clients"):
        spacing_sizes(rng, 30, 5, 5)


def test_uniform_sizes_mean_34_within_the_cap():
    t = uniform_sizes(np.random.default_rng(1), 20000, 67)
    assert t.min() == 1 and t.max() == 67
    assert abs(t.mean() - 34) < 4 * t.std() / np.sqrt(t.size)  # E round(U(1, 67)) = 34: 3 x 34 = 102 per client


def test_sun397_cap_respected_and_marginal_uniform():
    sup = np.arange(30) // 10  # 3 superclasses of 10 subclasses, 80 train / 20 test images each
    y, yt = np.repeat(np.arange(30), 80), np.repeat(np.arange(30), 20)
    opts = dict(sizes="uniform", group_size=1, max_per_superclass=67)
    tr, te = concept_drift((y, yt), 20, superclass=sup, seed=2, **opts)
    for p in tr:
        counts = np.bincount(sup[y[p]], minlength=3)
        assert (counts == counts[0]).all() and 1 <= counts[0] <= 67
    assert np.unique(np.concatenate(tr)).size == sum(p.size for p in tr)  # without replacement


def test_too_small_subclasses_lower_the_size_but_keep_the_marginal():
    sup = np.arange(10) // 5  # superclass 0: one subclass of 100 samples, four of 1; superclass 1: 5 x 40
    y = np.repeat(np.arange(10), [100, 1, 1, 1, 1] + [40] * 5)
    parts = concept_drift(y, 5, superclass=sup, seed=0)  # one group: piece = floor(104 / 5) = 20 per client
    counts = np.stack([np.bincount(sup[y[p]], minlength=2) for p in parts])
    # distinct subclasses in the group: only the first client finds 20 samples; the others get the 1 left
    assert counts.tolist() == [[20, 20]] + [[1, 1]] * 4


@pytest.mark.parametrize("opts, match", [
    (dict(sizes="dirichlet"), "sizes"), (dict(test="pooled"), "test"), (dict(group_size=0), "group_size"),
    (dict(max_per_superclass=0), "max_per_superclass"), (dict(equal_marginals=False), "equal_marginals"),
])
def test_bad_options(opts, match):
    with pytest.raises(ValueError, match=match):
        concept_drift(Y, 5, superclass=SUPER, seed=0, **opts)
