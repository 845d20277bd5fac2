"""FedRep: per round the head first (body frozen), then the body (head frozen); the head never travels."""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.fedrep import FEDREP
from pflkit.config import ConfigError
from pflkit.fl.federate import build_federation
from pflkit.fl.engines import nbytes
from pflkit.fl.train import get_state
from tests.helpers_data import digits_dataset, digits_env


@pytest.fixture(scope="module")
def setup():
    fed = build_federation(digits_dataset(), "shards", 3, seed=0, split="paired", val_fraction=0.0,
                           classes_per_client=2, samples_per_class=(20, 15))
    env = digits_env()
    env.seed_torch("init")
    return fed, env, get_state(env.model_fn())


def _update(setup, **kw):
    fed, env, init = setup
    cfg = FEDREP.make_config({"lr": 0.05, "momentum": 0.9, "batch_size": 10, **kw})
    state = FEDREP.init(env.model_fn(), fed, cfg, env)
    state["weights"] = init
    msg = FEDREP.broadcast(state, 0, cfg, env)
    return FEDREP.client_update(msg, fed.clients[0], None, cfg, env)


def test_head_first_then_body(setup):
    _, _, init = setup
    _, both = _update(setup, local_epochs=3, body_epochs=1)  # 2 head epochs, then 1 body epoch
    _, head_only = _update(setup, local_epochs=2, body_epochs=0)
    _, body_only = _update(setup, local_epochs=1, body_epochs=1)
    w, h, b = both["weights"], head_only["weights"], body_only["weights"]
    # the body phase leaves the head as the head phase made it, and the head phase never touches the body
    assert torch.equal(w["head.weight"], h["head.weight"]) and not torch.equal(h["head.weight"], init["head.weight"])
    assert torch.equal(h["body.0.weight"], init["body.0.weight"])
    assert torch.equal(b["head.weight"], init["head.weight"])
    # the body is trained on top of the trained head: different from training it on the initial head
    assert not torch.equal(w["body.0.weight"], b["body.0.weight"])


def test_only_the_body_travels(setup):
    _, _, init = setup
    upd, _ = _update(setup, local_epochs=2, body_epochs=1)
    assert "head.weight" not in upd.payload["values"] and "head.bias" not in upd.payload["values"]
    head = (init["head.weight"].numel() + init["head.bias"].numel()) * 4
    assert nbytes(upd.payload) == sum(v.numel() * v.element_size() for v in init.values()) - head


def test_separate_budget_is_the_earlier_reading(setup):
    """``epoch_budget="separate"``: head_epochs head epochs, then local_epochs body epochs."""
    _, total = _update(setup, local_epochs=3, body_epochs=1)
    _, separate = _update(setup, epoch_budget="separate", head_epochs=2, local_epochs=1, body_epochs=4)
    assert all(torch.equal(total["weights"][k], separate["weights"][k]) for k in total["weights"])


def test_phases_by_definition():
    assert FEDREP.make_config({}).phases() == (4, 1)  # FedSelect's 5 local epochs, FedRep's 1 body epoch
    assert FEDREP.make_config({"local_epochs": 11}).phases() == (10, 1)  # FedRep's own 10 + 1
    assert FEDREP.make_config({"epoch_budget": "separate"}).phases() == (10, 5)


def test_registry_and_bad_settings():
    assert ALGORITHMS["fedrep"] is FEDREP
    with pytest.raises(ConfigError, match="head_epochs"):
        FEDREP.make_config({"head_epochs": -1})
    with pytest.raises(ConfigError, match="^body_epochs=6"):
        FEDREP.make_config({"local_epochs": 5, "body_epochs": 6})
    with pytest.raises(ConfigError, match="^epoch_budget='both'"):
        FEDREP.make_config({"epoch_budget": "both"})
