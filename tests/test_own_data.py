"""A user's own data without editing pflkit: a registered dataset or a dataset object, a federation of
one's own index sets and domains, pretraining from a weights file, an Env without an experiment file,
and a diverged stage that keeps its best state and report.

Everything runs on a small slice of the embedded sklearn digits (a few clients, one or two rounds).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from pflkit.algorithms import ALGORITHMS, replace
from pflkit.config import ConfigError
from pflkit.data import Dataset, DatasetMeta, dataset_digest, load_dataset, register_dataset, unregister_dataset
from pflkit.data.datasets import dataset_names, dataset_options
from pflkit.run.experiments import resolve
from pflkit.fl.algorithm import Update
from pflkit.fl.federation import Federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import set_state
from pflkit.io import load_torch, read_json
from pflkit.run.environment import initial_model
from pflkit.run.folder import RunMismatchError, load_final_states
from pflkit.run.runner import run_experiment
from pflkit.run.stages import env_for_model, train_algorithm

MODEL = {"name": "digits_cnn", "options": {"channels": [4, 8, 8]}}
FEDAVG = {"algorithm": "fedavg", "rounds": 1, "fraction": 1.0, "lr": 0.05, "batch_size": 16}


def own_dataset(n: int = 240, name: str = "own", flip: bool = False) -> Dataset:
    """``n`` digits in a train split only (no test split, no files): the shape of a user's own arrays."""
    d = load_dataset("digits")
    y = d.y_train[:n].clone()
    if flip:
        y[0] = (y[0] + 1) % 10  # one changed label: other data
    meta = DatasetMeta(name, 10, tuple(map(str, range(10))), (1, 8, 8), (0.3,), (0.4,))
    return Dataset(meta, d.x_train[:n], y, d.x_train[:0], y[:0])


@pytest.fixture
def registered():
    """Registers datasets for one test and removes them afterwards."""
    names = []

    def add(name, loader, **kw):
        register_dataset(name, loader, **kw)
        names.append(name)
    yield add
    for name in set(names):
        unregister_dataset(name)


def spec(dataset: str = "own", num_clients: int = 3, **extra) -> dict:
    return {"experiment": {"name": "own-data"}, "data": {"dataset": dataset, "num_clients": num_clients,
                                                          "scheme": "iid"},
            "model": MODEL, "methods": {"FedAvg": FEDAVG}, **extra}


def index_sets(n: int = 240, clients: int = 3, seed: int = 0):
    """Disjoint train / val / test positions for each client."""
    parts = np.array_split(np.random.default_rng(seed).permutation(n), clients)
    return [p[:50] for p in parts], [p[60:80] for p in parts], [p[50:60] for p in parts]


# ------------------------------------------------------------------ 1. a registered dataset, end to end


def test_a_registered_dataset_runs_end_to_end_and_a_change_of_its_arrays_refuses_resume(registered, tmp_path):
    registered("own", lambda n=240: own_dataset(n))
    assert "own" in dataset_names() and dataset_options("own") == {"n": 240}
    out = tmp_path / "run"
    res = run_experiment(resolve(spec(), "smoke"), out, progress=False)
    assert res["status"] == "ok" and len(res["methods"]["FedAvg"]["per_client"][0]) == 3
    data = res["data"]
    assert data["name"] == "own" and data["origin"] == "register_dataset" and data["files"] == []
    assert data["arrays_sha256"] == dataset_digest(load_dataset("own")) and data["samples"] == {"train": 240, "test": 0}
    assert data["source"].startswith("register_dataset(")  # what it came from, not a stand-in's name
    again = run_experiment(resolve(spec(), "smoke"), out, resume=True, progress=False)
    assert again["methods"]["FedAvg"]["per_seed"] == res["methods"]["FedAvg"]["per_seed"]
    registered("own", lambda n=240: own_dataset(n, flip=True), replace=True)  # the same name, other arrays
    with pytest.raises(RunMismatchError, match=r"data\.arrays_sha256"):
        run_experiment(resolve(spec(), "smoke"), out, resume=True, progress=False)


def test_a_registered_dataset_can_be_the_pretraining_data(registered, tmp_path):
    registered("own", own_dataset(200))
    registered("own-pre", own_dataset(120, name="whatever"))
    pretrain = {**FEDAVG, "eval_every": 0, "keep_best": False,
                "data": {"dataset": "own-pre", "num_clients": 2, "scheme": "iid", "test_fraction": 0.0}}
    res = run_experiment(resolve(spec(pretrain=pretrain, methods={}), "smoke"), tmp_path / "run", progress=False)
    assert res["status"] == "ok"
    pre = res["pretrain_data"]
    assert pre["name"] == "own-pre" and pre["origin"] == "register_dataset" and pre["files"] == []
    assert pre["arrays_sha256"] == dataset_digest(load_dataset("own-pre"))
    assert read_json(tmp_path / "run" / "run.json")["fingerprint"]["pretrain_data"]["arrays_sha256"] == \
        pre["arrays_sha256"]


def _bad_labels():
    d = own_dataset(20)
    return dataclasses.replace(d, y_train=d.y_train + 10)


@pytest.mark.parametrize("name, loader, error, needle", [
    ("my data", own_dataset(20), ValueError, "name='my data'"),
    ("digits", own_dataset(20), ValueError, "name='digits' is one of pflkit's own"),
    ("own2", lambda n: own_dataset(n), ValueError, "parameter 'n' without a default"),
    ("own2", 42, TypeError, "loader for 'own2' is a int"),
    ("own2", _bad_labels(), ValueError, "labels outside [0, 10)"),
])
def test_bad_registrations_are_one_line_errors(name, loader, error, needle):
    with pytest.raises(error) as e:
        register_dataset(name, loader)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert "own2" not in dataset_names()


@pytest.mark.parametrize("changes, needle", [
    (["data.dataset=nope"], "data.dataset='nope': unknown dataset; known: digits"),
    (["data.options={ n = 10, size = 3 }"], "data.options.size=3: not an option of dataset 'own' (its options: n)"),
])
def test_an_unknown_dataset_or_option_fails_before_the_folder_is_touched(registered, tmp_path, changes, needle):
    registered("own", lambda n=240: own_dataset(n))
    with pytest.raises(ConfigError) as e:
        run_experiment(resolve(spec(), "smoke", changes), tmp_path / "run", progress=False)
    assert needle in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_a_name_is_registered_once_unless_replaced(registered):
    registered("own", own_dataset(20))
    with pytest.raises(ValueError, match="already registered; pass replace=True"):
        register_dataset("own", own_dataset(30))
    registered("own", own_dataset(30), replace=True)
    assert len(load_dataset("own").y_train) == 30


def test_a_loader_checked_at_load_time():
    register_dataset("own-late", lambda: "not a dataset")
    try:
        with pytest.raises(TypeError, match="'own-late': a str, not a pflkit.data.Dataset"):
            load_dataset("own-late")
    finally:
        unregister_dataset("own-late")


# ------------------------------------------------------------------ 2. a federation of one's own index sets


def test_a_federation_from_index_sets_gives_each_client_exactly_its_sets():
    ds = load_dataset("digits")  # train and test splits: test sample j is position n_train + j
    n_train = len(ds.y_train)
    train = [np.array([5, 1, 9]), np.arange(10, 30), np.array([n_train + 3, 40])]
    val = [np.array([2]), [], np.array([41, 42])]
    test = [np.array([n_train, n_train + 1]), np.array([50]), torch.tensor([60, 61])]
    fed = Federation.from_indices(ds, train, test, val, domains=["ink", "paper", "ink"], unseen=[1])
    assert fed.num_clients == 3 and fed.unseen_ids == [1] and fed.seen_ids == [0, 2]
    for c, tr, va, te in zip(fed.clients, train, val, test):
        for split, given in (("train", tr), ("val", va), ("test", te)):
            assert np.array_equal(c.splits[split], np.asarray(given, dtype=np.int64)), (c.id, split)
            _, y = c.tensors(split) if c.num(split) else (None, torch.zeros(0, dtype=torch.long))
            pooled = torch.cat([ds.y_train, ds.y_test])
            assert torch.equal(y, pooled[torch.as_tensor(np.asarray(given, dtype=np.int64))])
    assert fed.group_of_clients("domain").tolist() == [0, 1, 0]
    assert fed.recipe["domain_names"] == ["ink", "paper"] and fed.recipe["scheme"] == "given"
    assert [c.info["pool"] for c in fed.clients] == ["seen", "unseen", "seen"]
    assert fed.recipe["indices_sha256"] == fed.digest()


def test_a_federation_of_ones_own_is_saved_and_loaded_as_given(tmp_path):
    ds = own_dataset()
    train, val, test = index_sets()
    fed = Federation.from_indices(ds, train, test, val, domains=[3, 0, 3])
    fed.save(tmp_path / "f.npz")
    back = Federation.load(tmp_path / "f.npz", ds)
    assert back.digest() == fed.digest() and back.recipe == fed.recipe
    assert back.group_of_clients("domain").tolist() == [3, 0, 3]


@pytest.mark.parametrize("train, test, kw, needle", [
    ([[0, 1]], [[2], [3]], {}, "one index set per client"),
    ([[0, 240]], [[2]], {}, "client 0 train: positions must be in [0, 240)"),
    ([[0, -1]], [[2]], {}, "client 0 train: positions must be in [0, 240)"),
    ([[0.0, 1.0]], [[2]], {}, "client 0 train: expected a 1-D set of integer positions"),
    ([[0], []], [[2], [3]], {}, "client 1 train: empty"),
    ([[0, 1, 2]], [[2]], {}, "client 0: samples [2] appear twice"),
    ([[0, 1]], [[2]], {"domains": ["a", "b"]}, "domains: 2 labels for 1 clients"),
    ([[0, 1]], [[2]], {"domains": [-1]}, "domains: use integers >= 0 or strings"),
    ([[0], [1]], [[2], [3]], {"unseen": [0, 1]}, "every client is unseen"),
    ([[0]], [[2]], {"augment": "rotate"}, "augment='rotate'"),
])
def test_bad_index_sets_are_one_line_errors(train, test, kw, needle):
    with pytest.raises(ValueError) as e:
        Federation.from_indices(own_dataset(), train, test, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_run_experiment_takes_a_dataset_object_and_its_federation(tmp_path):
    ds = own_dataset(name="mine")
    train, val, test = index_sets()
    fed = Federation.from_indices(ds, train, test, val, domains=["a", "b", "a"])
    cfg = resolve(spec("mine"), "smoke")
    out = tmp_path / "run"
    res = run_experiment(cfg, out, dataset=ds, federation=fed, progress=False)
    assert res["status"] == "ok"
    assert res["data"]["origin"] == "run_experiment(dataset=...)" and res["data"]["arrays_sha256"] == dataset_digest(ds)
    assert res["federation"]["given"] and res["federation"]["domain_names"] == ["a", "b"]
    assert res["federation"]["sizes"]["train"] == [50, 50, 50] and res["federation"]["indices_sha256"] == fed.digest()
    assert Federation.load(out / "seed0" / "federation.npz", ds).digest() == fed.digest()  # trained on these clients
    # the same data and clients through pflkit.run.stages, without the experiment: the same numbers
    env = env_for_model("digits_cnn", fed, channels=[4, 8, 8])
    direct = train_algorithm("fedavg", fed, env, rounds=1, fraction=1.0, lr=0.05, batch_size=16)
    assert [100 * direct.per_client[i]["acc"] for i in range(3)] == res["methods"]["FedAvg"]["per_client"][0]
    other = Federation.from_indices(ds, [t[:-1] for t in train], test, val)  # one sample fewer per client
    with pytest.raises(RunMismatchError, match=r"federation\.indices_sha256"):
        run_experiment(cfg, out, dataset=ds, federation=other, resume=True, progress=False)


@pytest.mark.parametrize("changes, kwargs, needle", [
    (["data.dataset=digits"], {}, "data.dataset='digits': the dataset given is 'mine'"),
    (["data.num_clients=4"], {}, "data.num_clients=4: the federation given has 3 clients"),
    (["data.task=superclass"], {}, "data.task='superclass'"),
    ([], {"trainer": "flower"}, "the flower engine's nodes build their clients"),
    ([], {"dataset": "mine"}, "run_experiment(dataset=...): dataset '?': a str"),
    ([], {"federation": "fed"}, "run_experiment(federation=...): a str, not a Federation"),
    ([], {"no_val": True}, "clients [0, 1, 2] have no validation samples, but stage 'FedAvg' keeps its best"),
    ([], {"no_test": True}, "clients [1] have no test samples"),
])
def test_a_given_dataset_or_federation_that_does_not_fit_fails_before_any_work(tmp_path, changes, kwargs, needle):
    ds = own_dataset(name="mine")
    train, val, test = index_sets()
    if kwargs.pop("no_test", False):
        test[1] = []
    fed = Federation.from_indices(ds, train, test, None if kwargs.pop("no_val", False) else val)
    if kwargs.get("trainer") == "flower":
        from pflkit.flower.serve import flower_trainer

        kwargs["trainer"] = flower_trainer(None)
    args = {"dataset": ds, "federation": fed, **kwargs}
    with pytest.raises(ConfigError) as e:
        run_experiment(resolve(spec("mine"), "smoke", changes), tmp_path / "run", progress=False, **args)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_a_federation_over_other_data_is_refused(tmp_path):
    ds, small = own_dataset(name="mine"), own_dataset(200, name="mine")
    train, val, test = index_sets(200)
    fed = Federation.from_indices(small, train, test, val)
    with pytest.raises(ConfigError, match="made over 'mine' with 200 samples, but the run's dataset is 'mine' with 24"):
        run_experiment(resolve(spec("mine"), "smoke"), tmp_path / "run", dataset=ds, federation=fed, progress=False)


# ------------------------------------------------------------------ 3. pretraining from a weights file


def test_starting_from_a_weights_file_gives_the_numbers_of_the_same_start_in_memory(tmp_path):
    ds = own_dataset(name="mine")
    train, val, test = index_sets()
    fed = Federation.from_indices(ds, train, test, val)
    env = env_for_model("digits_cnn", fed, channels=[4, 8, 8])
    pretrained = train_algorithm("fedavg", fed, env, rounds=2, fraction=1.0, lr=0.05, batch_size=16, eval_every=0)
    weights = ALGORITHMS["fedavg"].global_model(pretrained.state)
    torch.save(weights, tmp_path / "w.pt")
    ft = {"algorithm": "finetune", "bn": "client", "epochs": 1, "lr": 0.01}
    cfg = resolve(spec("mine", pretrain={"algorithm": "none", "weights": str(tmp_path / "w.pt")},
                       methods={"FT": ft}), "smoke")
    res = run_experiment(cfg, tmp_path / "run", dataset=ds, federation=fed, progress=False)
    assert res["status"] == "ok" and res["weights"][0]["what"] == "pretrain.weights"
    in_memory = train_algorithm("finetune", fed, env, model=set_state(initial_model(env), weights),
                                bn="client", epochs=1, lr=0.01)
    assert [100 * in_memory.per_client[i]["acc"] for i in range(3)] == res["methods"]["FT"]["per_client"][0]
    assert read_json(tmp_path / "run" / "run.json")["fingerprint"]["pretrain_weights"]["sha256"] == \
        res["weights"][0]["sha256"]


# ------------------------------------------------------------------ 4. an Env without an experiment file


def test_env_for_model_checks_its_settings_up_front():
    fed = Federation.from_indices(own_dataset(), *index_sets()[::2])
    env = env_for_model(lambda: torch.nn.Linear(64, 10), seed=3, device="cpu")
    assert env.seed == 3 and env.device == torch.device("cpu") and isinstance(env.model_fn(), torch.nn.Linear)
    for kwargs, needle in (({"model": "digits_cnn"}, "needs the federation"),
                           ({"model": lambda: 1}, "returned a int"),
                           ({"model": "digits_cnn", "fed": fed, "device": "tpu"}, "device='tpu'"),
                           ({"model": "digits_cnn", "fed": fed, "engine": "gpu"}, "engine='gpu'")):
        with pytest.raises(ConfigError, match=needle):
            env_for_model(**kwargs)


# ------------------------------------------------------------------ 5. a diverged stage keeps its best state


def diverging_fedavg(after_calls: int):
    """FedAvg whose clients report a NaN loss from their ``after_calls``-th update on."""
    algo, calls = ALGORITHMS["fedavg"], []

    def update(msg, client, client_state, cfg, env):
        calls.append(client.id)
        upd, cs = algo.client_update(msg, client, client_state, cfg, env)
        return (Update(upd.client_id, upd.num_samples, upd.payload, {"loss": math.nan}) if len(calls) >= after_calls
                else upd), cs
    return replace(algo, name="fedavg-nan", client_update=update,
                   report=lambda state, fed, cfg, env, client_states: {"kept_keys": len(state["weights"])})


def test_a_diverged_stage_keeps_the_best_state_found_before():
    train, val, test = index_sets()
    fed = Federation.from_indices(own_dataset(), train, test, val)
    env = env_for_model("digits_cnn", fed, channels=[4, 8, 8])
    cfg = ALGORITHMS["fedavg"].make_config({**{k: v for k, v in FEDAVG.items() if k != "algorithm"}, "rounds": 2,
                                            "keep_best": True, "eval_every": 1})
    clean = run_rounds(ALGORITHMS["fedavg"], cfg, fed, initial_model(env), env)
    diverged = run_rounds(diverging_fedavg(7), dataclasses.replace(cfg, rounds=4), fed, initial_model(env), env)
    assert diverged.status == "diverged" and "round 3" in diverged.error and diverged.per_client == {}
    assert diverged.best_round == clean.best_round is not None
    for k, v in clean.state["weights"].items():
        assert torch.equal(diverged.state["weights"][k], v), k


def test_a_diverged_method_is_marked_with_its_best_state_and_report_kept(tmp_path, monkeypatch, registered):
    registered("own", own_dataset())
    monkeypatch.setitem(ALGORITHMS, "fedavg-nan", diverging_fedavg(7))
    method = {**FEDAVG, "algorithm": "fedavg-nan", "rounds": 3, "eval_every": 1}
    out = tmp_path / "run"
    res = run_experiment(resolve(spec(methods={"NaN": method}), "smoke"), out, progress=False, keep_states=True)
    entry = res["methods"]["NaN"]
    assert res["status"] == entry["status"] == "diverged" and entry["acc_mean"] is None
    assert entry["best_round"][0] in (1, 2) and "round 3" in entry["error"]
    assert read_json(out / "seed0" / "nan.report.json") == {"kept_keys": len(load_torch(
        out / "seed0" / "nan.final.pt")["state"]["weights"])}
    kept = load_final_states(out, "NaN")["state"]["weights"]
    assert all(bool(torch.isfinite(v).all()) for v in kept.values() if v.is_floating_point())


# ------------------------------------------------------------------ 6. the README's example runs


def test_the_readme_example_runs(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"### Your own data\n.*?```python\n(.*?)```", text, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the repository's own documentation
    finally:
        unregister_dataset("my_digits")
    res = read_json(tmp_path / "runs" / "my_digits" / "results.json")
    assert res["status"] == "ok" and res["federation"]["domain_names"] == ["scanner A", "scanner B"]
    assert res["data"]["origin"] == "register_dataset" and res["config"]["data"]["dataset"] == "my_digits"
