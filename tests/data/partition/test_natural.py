import numpy as np
import pytest

from pflkit.data.partition import natural, natural_groups

SPK = np.repeat([5, 1, 9, 3, 7], [10, 40, 25, 5, 30])  # group 1 largest, then 7, 9, 5, 3
Y = np.arange(SPK.size) % 4


def test_one_group_per_client():
    parts = natural(Y, 5, groups={"speaker": SPK}, key="speaker", seed=0)
    chosen = natural_groups(Y, 5, groups={"speaker": SPK}, key="speaker", seed=0)
    assert list(chosen) == [1, 3, 5, 7, 9]
    for p, g in zip(parts, chosen):
        assert np.array_equal(p, np.flatnonzero(SPK == g))


def test_largest_groups_chosen():
    chosen = natural_groups(Y, 3, groups={"speaker": SPK}, key="speaker", seed=0)
    assert list(chosen) == [1, 7, 9]
    parts = natural(Y, 3, groups={"speaker": SPK}, key="speaker", seed=0)
    assert [p.size for p in parts] == [40, 30, 25]


def test_random_choice_is_seeded():
    picks = {tuple(natural_groups(Y, 2, groups={"s": SPK}, key="s", seed=s, choose="random"))
             for s in range(20)}
    assert len(picks) > 3  # not always the same pair
    a = natural(Y, 2, groups={"s": SPK}, key="s", seed=4, choose="random")
    b = natural(Y, 2, groups={"s": SPK}, key="s", seed=4, choose="random")
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_paired_splits_rank_by_total():
    spk_te = np.array([3] * 60 + [5] * 2)
    y_te = np.zeros(62, int)
    tr, te = natural((Y, y_te), 2, groups=({"s": SPK}, {"s": spk_te}), key="s", seed=0)
    # totals: 1->40, 3->65, 5->12, 7->30, 9->25
    assert [set(SPK[p]) for p in tr] == [{1}, {3}]
    assert te[0].size == 0 and np.array_equal(te[1], np.arange(60))


@pytest.mark.parametrize("kw", [dict(num_clients=6), dict(key="drawer"),
                                dict(choose="smallest"), dict(groups={"speaker": SPK[:3]})])
def test_bad_arguments(kw):
    args = dict(num_clients=2, groups={"speaker": SPK}, key="speaker") | kw
    with pytest.raises(ValueError):
        natural(Y, seed=0, **args)
