"""to_record / from_record on every algorithm's real messages, payloads and states; settings round trip."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from pflkit.algorithms import ALGORITHMS
from pflkit.run.experiments import list_experiments, resolve
from pflkit.fl.federate import build_federation
from pflkit.fl.engines import nbytes
from pflkit.flower.client_app import load_client_state, save_client_state
from pflkit.flower.records import from_record, get, put, record_nbytes, tensors_in, to_record
from pflkit.flower.runtime import experiment_to_raw
from tests.helpers_compare import assert_tree
from tests.helpers_data import digits_dataset, digits_env


def roundtrip(obj):
    return from_record(to_record(obj))


SETTINGS = {
    "fedavg": {},
    "fedl2p": {"epochs": 1, "meta_iters": 1, "lr": 0.05},
    "pfedhn": {"local_steps": 2},
    "pfedhn_pc": {"local_steps": 2},
    "fedselect": {"ltn_iterations": 1, "ltn_epochs": 1, "local_epochs": 1},
    "pfedvem": {"local_epochs": 1, "head_steps": 2, "report_fraction": 0.0},
}


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(600), "dirichlet", 3, seed=0, alpha=0.5)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_message_payload_and_state_of_two_rounds_comes_back_identical(fed, name):
    """Round 2 covers what only appears later: FedSelect's sparse message, pFedVEM's posteriors, PC's heads."""
    algo = ALGORITHMS[name]
    cfg = algo.make_config({"batch_size": 16, **SETTINGS[name]})
    env = digits_env(seed=1)
    env.seed_torch("init")
    state = algo.init(env.model_fn(), fed, cfg, env)
    assert_tree(state, roundtrip(state))
    client_states = {}
    for t in range(2):
        now, updates = env.at_round(t), []
        for cid in (0, 1):
            msg = algo.broadcast(state, cid, cfg, now)
            back = roundtrip(msg)
            assert_tree(msg, back)
            upd, client_states[cid] = algo.client_update(back, fed.clients[cid], client_states.get(cid), cfg, now)
            assert_tree(upd.payload, roundtrip(upd.payload))
            assert_tree(client_states[cid], roundtrip(client_states[cid]))
            updates.append(upd)
            if nbytes(msg) and not _aliased(msg):
                assert record_nbytes(to_record(msg)) == nbytes(msg)
        state = algo.aggregate(state, updates, cfg, env)
        assert_tree(state, roundtrip(state))


def _aliased(obj) -> bool:
    ts = tensors_in(obj)
    return len({id(t) for t in ts}) < len(ts)


def test_awkward_values_keep_type_dtype_and_aliasing():
    w = torch.randn(3, 2)
    obj = {"w": w, "again": [w], 7: (None, True, 3, 2.5, float("nan"), "s"), (1, "a"): {},
           "bf16": torch.randn(4).to(torch.bfloat16), "bits": torch.tensor([True, False]),
           "i64": torch.arange(3), "np": np.arange(4, dtype=np.int16), "npf": np.float32(1.5),
           "size": torch.Size([2, 3]), "dtype": torch.float16, "grad": torch.ones(2, requires_grad=True),
           "strided": torch.arange(12.0).reshape(3, 4).t(), "empty": torch.zeros(0, 5)}
    back = roundtrip(obj)
    assert_tree(obj, back)
    assert back["w"] is back["again"][0]  # sent once, one tensor again
    assert record_nbytes(to_record(obj)) == nbytes(obj) - w.numel() * 4  # the alias travels once


def test_dataclasses_of_pflkit_travel_and_others_are_refused():
    from pflkit.fl.algorithm import Update

    upd = Update(3, 10, {"delta": torch.ones(2)}, {"loss": 0.5})
    assert_tree(upd, roundtrip(upd))

    @dataclasses.dataclass
    class Foreign:
        x: int = 1

    rec = to_record(Foreign())
    with pytest.raises(TypeError, match="only pflkit dataclasses"):
        from_record(rec)


def test_unsendable_values_are_named_by_their_path():
    with pytest.raises(TypeError, match=r"\$\['model'\]\[0\]"):
        to_record({"model": [torch.nn.Linear(2, 2)]})


def test_put_and_get_share_a_recorddict_with_other_records():
    content = RecordDict({"header": ConfigRecord({"round": 3})})
    put(content, "a", {"x": torch.ones(2)})
    put(content, "b", [1, None])
    assert_tree(get(content, "a"), {"x": torch.ones(2)})
    assert get(content, "b") == [1, None] and get(content, "c", None) is None
    assert content["header"]["round"] == 3


def test_client_state_versions_serve_keep_best():
    """The state as of the best round is the latest version <= it; older versions are dropped."""
    state = RecordDict()
    save_client_state(state, "ns", 1, {"v": torch.tensor(1.0)}, keep_from=0)
    save_client_state(state, "ns", 3, {"v": torch.tensor(3.0)}, keep_from=2)  # round 1 is the best so far's state
    save_client_state(state, "ns", 5, {"v": torch.tensor(5.0)}, keep_from=2)
    assert float(load_client_state(state, "ns")["v"]) == 5.0
    assert float(load_client_state(state, "ns", at=2)["v"]) == 1.0
    assert float(load_client_state(state, "ns", at=4)["v"]) == 3.0
    assert load_client_state(state, "ns", at=0) is None
    save_client_state(state, "ns", 7, {"v": torch.tensor(7.0)}, keep_from=5)  # best moved: 1 and 3 are not needed
    assert list(state["ns/cs-rounds"]["rounds"]) == [5, 7]
    save_client_state(state, "ns", 8, None, keep_from=-1)  # no keep-best: only the latest
    assert list(state["ns/cs-rounds"]["rounds"]) == [8] and load_client_state(state, "ns") is None


def test_client_state_files_outlive_the_node_and_a_resumed_run_drops_the_stopped_runs_later_versions(tmp_path):
    folder = tmp_path / "client3"
    state = RecordDict()
    for r in (1, 2, 3, 4):  # the last checkpoint was at round 2: versions after it are kept too
        save_client_state(state, "ns", r, {"v": torch.tensor(float(r))}, keep_from=2, folder=folder)
    assert sorted(f.name for f in folder.iterdir()) == ["cs@2.pt", "cs@3.pt", "cs@4.pt"]
    restarted = RecordDict()  # a new run: the node's context is empty, its files are not
    assert float(load_client_state(restarted, "ns", at=2, folder=folder)["v"]) == 2.0
    assert load_client_state(restarted, "ns", at=2) is None  # without the folder nothing is left
    save_client_state(restarted, "ns", 3, {"v": torch.tensor(30.0)}, keep_from=2, folder=folder)
    assert sorted(f.name for f in folder.iterdir()) == ["cs@2.pt", "cs@3.pt"]  # the stopped run's round 4 went
    assert float(load_client_state(RecordDict(), "ns", at=9, folder=folder)["v"]) == 30.0


def test_every_experiment_survives_the_trip_through_run_settings():
    for name, path in list_experiments().items():
        cfg = resolve(path, "smoke")
        assert resolve(experiment_to_raw(cfg), "smoke") == cfg, name
