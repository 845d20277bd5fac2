"""Ditto: the global model is FedAvg's, the personal model is pulled toward it by lambda."""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.ditto import DITTO, proximal_term
from pflkit.config import ConfigError
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import SGD_ROUNDS, init_model, shards_fed
from tests.helpers_data import digits_env

@pytest.fixture(scope="module")
def fed():
    return shards_fed(4)


def _run(algo, fed, **kw):
    env = digits_env()
    return run_rounds(algo, algo.make_config({**SGD_ROUNDS, **kw}), fed, init_model(env), env)


def test_global_model_follows_fedavg_exactly_and_personal_models_help(fed):
    ditto, fedavg = _run(DITTO, fed, lam=0.1), _run(ALGORITHMS["fedavg"], fed)
    for k, v in fedavg.state["weights"].items():
        assert torch.equal(ditto.state["weights"][k], v), k
    assert ditto.summary["acc"] > fedavg.summary["acc"]  # two classes per client: personal wins


def test_proximal_gradient_by_hand():
    model = torch.nn.Linear(3, 2)
    anchor = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    proximal_term(model, anchor, 0.7)(model).backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, 0.7 * (p.detach() - anchor[n]))


def test_larger_lambda_keeps_personal_models_closer_to_the_global_one(fed):
    def distance(lam):
        res = _run(DITTO, fed, lam=lam, rounds=1)
        g = res.state["weights"]
        return sum(float((cs[k] - g[k]).pow(2).sum()) for cs in res.client_states.values()
                   for k, _ in digits_env().model_fn().named_parameters())

    assert distance(10.0) < 0.5 * distance(0.0)


def test_bad_lambda():
    with pytest.raises(ConfigError, match="lam"):
        DITTO.make_config({"lam": -1})
