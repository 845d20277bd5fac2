import numpy as np
import pytest

from pflkit.fl.federate import build_federation
from pflkit.fl.federation import Federation
from tests.helpers_data import digits_dataset


@pytest.fixture(scope="module")
def ds():
    return digits_dataset()


def _all(fed):
    return np.concatenate([np.concatenate([c.splits[s] for s in ("train", "val", "test")]) for c in fed.clients])


def test_pool_split_ratios_and_disjointness(ds):
    fed = build_federation(ds, "iid", 8, seed=1, test_fraction=0.2, val_fraction=0.2)
    idx = _all(fed)
    assert len(idx) == len(np.unique(idx)), "a sample went to two clients or two splits"
    for c in fed.clients:
        n = c.num("train") + c.num("val") + c.num("test")
        assert abs(c.num("test") - 0.2 * n) <= 1
        assert abs(c.num("val") - 0.2 * (n - c.num("test"))) <= 1


def test_paired_split_uses_the_test_set_with_the_same_classes(ds):
    fed = build_federation(ds, "pathological", 10, seed=0, split="paired", classes_per_client=2)
    n_train = len(ds.y_train)
    for c in fed.clients:
        assert (c.splits["test"] >= n_train).all() and (c.splits["train"] < n_train).all()
        assert set(np.flatnonzero(c.histogram("test"))) <= set(np.flatnonzero(c.histogram("train") + c.histogram("val")))
        assert len(np.flatnonzero(c.histogram("train"))) <= 2


def test_superclass_task_relabels(ds):
    fed = build_federation(ds, "iid", 4, seed=0, task="superclass")
    assert fed.num_classes == 2
    assert set(fed.y.unique().tolist()) == {0, 1}


def test_save_load_roundtrip(ds, tmp_path):
    fed = build_federation(ds, "dirichlet", 6, seed=3, alpha=0.3)
    fed.save(tmp_path / "fed.npz")
    back = Federation.load(tmp_path / "fed.npz", ds)
    for a, b in zip(fed.clients, back.clients):
        for s in ("train", "val", "test"):
            np.testing.assert_array_equal(a.splits[s], b.splits[s])
    assert back.recipe["options"] == {"alpha": 0.3}


def test_group_metadata_reaches_clients(ds):
    fed = build_federation(ds, "natural", 4, seed=0, key="writer")
    assert sorted(fed.group_of_clients("writer").tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("kw, match", [
    ({"scheme": "nope"}, "unknown"),
    ({"split": "weird"}, "split"),
    ({"test_fraction": 1.0}, "test_fraction"),
    ({"task": "superclass", "scheme": "iid"}, None),
])
def test_bad_arguments(ds, kw, match):
    args = {"scheme": "iid", "num_clients": 4, "seed": 0, **kw}
    scheme, n = args.pop("scheme"), args.pop("num_clients")
    if match is None:
        build_federation(ds, scheme, n, **args)
        return
    with pytest.raises(ValueError, match=match):
        build_federation(ds, scheme, n, **args)


def test_too_many_clients_is_a_clear_error(ds):
    with pytest.raises(ValueError):
        build_federation(ds, "iid", 10**6, seed=0)


def test_a_subset_renumbers_its_clients_and_keeps_the_unseen_ones_among_them():
    fed = build_federation(digits_dataset(), "dirichlet", 8, seed=0, alpha=1.0, unseen_clients=2)
    ids = [fed.unseen_ids[0], *fed.seen_ids[:2]]
    sub = fed.subset(ids)
    assert [c.id for c in sub.clients] == [0, 1, 2] and sub.recipe["subset"] == ids
    assert sub.unseen_ids == [0] and sub.seen_ids == [1, 2]
    for j, i in enumerate(ids):
        assert all(np.array_equal(sub.clients[j].splits[s], fed.clients[i].splits[s]) for s in fed.clients[i].splits)
