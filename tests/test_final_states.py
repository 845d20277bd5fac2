"""Opt-in final states: a run keeps every stage's trained server and client states, weights-only."""
from __future__ import annotations

import pytest
import torch

from pflkit.run.experiments import resolve
from pflkit.fl.train import evaluate_model, set_state
from pflkit.run.folder import final_states_path, load_final_states
from pflkit.run.runner import run_experiment


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    out = tmp_path_factory.mktemp("kept")
    cfg = resolve("fedselect_table1_s2", "smoke")
    return cfg, out, run_experiment(cfg, out, progress=False, keep_states=True)


@pytest.mark.needs_data(experiments=["fedselect_table1_s2"])
def test_final_states_are_kept_only_when_asked(kept, tmp_path):
    cfg, out, results = kept
    assert results["status"] == "ok"
    for stage in (cfg.pretrain, *cfg.methods):
        assert final_states_path(out, stage.label).exists(), stage.label
    plain = tmp_path / "plain"
    run_experiment(resolve("demo", "smoke"), plain, progress=False)
    assert not list(plain.rglob("*.final.pt"))


@pytest.mark.needs_data(experiments=["fedselect_table1_s2"])
def test_kept_states_reproduce_the_reported_accuracies(kept):
    """FedAvg's kept server weights give its per-client test accuracies again; FedSelect's kept client
    states hold every client's personal mask (what Fig. 1 needs, without training again)."""
    cfg, out, results = kept
    from pflkit.fl.federation import Federation
    from pflkit.data.datasets import load_dataset
    from pflkit.run.environment import make_env

    fed = Federation.load(out / "seed0" / "federation.npz", load_dataset(cfg.data.dataset))
    env = make_env(cfg, fed, 0)
    fedavg = load_final_states(out, "FedAvg")
    accs = [100 * evaluate_model(set_state(env.model_fn(), fedavg["state"]["weights"]), c, "test")["acc"]
            for c in fed.clients]
    assert accs == pytest.approx(results["methods"]["FedAvg"]["per_client"][0])
    sel = load_final_states(out, "FedSelect (0.50)")
    assert sorted(sel["client_states"]) == list(range(fed.num_clients))
    assert all(isinstance(v, torch.Tensor) for v in sel["state"]["weights"].values())


def test_missing_final_states_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="keep_states=True"):
        load_final_states(tmp_path, "FedAvg")
