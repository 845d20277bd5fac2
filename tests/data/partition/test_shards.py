import numpy as np
import pytest

from pflkit.data.partition import label_histogram, shard_classes, shards

TR = np.repeat(np.arange(10), 90)
TE = np.repeat(np.arange(10), 400)


@pytest.mark.parametrize("s", [2, 4])
def test_exact_counts_fedselect_setup(s):
    tr, te = shards((TR, TE), 10, classes_per_client=s, samples_per_class=(20, 100), seed=s)
    htr, hte = label_histogram(TR, tr, 10), label_histogram(TE, te, 10)
    assert ((htr > 0).sum(1) == s).all()
    assert set(np.unique(htr)) == {0, 20} and set(np.unique(hte)) == {0, 100}
    assert np.array_equal(htr > 0, hte > 0)  # same classes in train and test
    uses = (htr > 0).sum(0)
    assert uses.max() - uses.min() <= 1
    for parts in (tr, te):
        allidx = np.concatenate(parts)
        assert np.unique(allidx).size == allidx.size
    chosen = shard_classes((TR, TE), 10, classes_per_client=s, samples_per_class=(20, 100), seed=s)
    assert np.array_equal(np.sort(chosen, 1), np.stack([np.flatnonzero(r) for r in htr > 0]))


def test_single_split_scalar_option():
    parts = shards(TR, 5, classes_per_client=3, samples_per_class=10, seed=0)
    assert [p.size for p in parts] == [30] * 5


def test_too_few_samples_names_the_class():
    y = np.concatenate([np.repeat([0, 1, 2, 4, 5, 6, 7, 8, 9], 50), [3] * 15])
    with pytest.raises(ValueError, match="class 3 has 15 samples"):
        shards(y, 10, classes_per_client=2, samples_per_class=10, seed=0)


def test_determinism():
    a = shards(TR, 10, classes_per_client=2, samples_per_class=20, seed=4)
    b = shards(TR, 10, classes_per_client=2, samples_per_class=20, seed=4)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("kw", [dict(classes_per_client=11, samples_per_class=1),
                                dict(classes_per_client=2, samples_per_class=0),
                                dict(classes_per_client=2, samples_per_class=(20, 100)),
                                dict(classes_per_client=2, samples_per_class=46)])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        shards(TR, 10, seed=0, **kw)
