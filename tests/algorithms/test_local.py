import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import local_sgd
from tests.helpers_data import digits_dataset, digits_env

LOCAL = ALGORITHMS["local"]


def test_local_is_each_client_training_alone_and_sends_nothing():
    fed = build_federation(digits_dataset(), "dirichlet", 4, seed=0, alpha=0.3)
    env = digits_env()
    cfg = LOCAL.make_config({"rounds": 2, "lr": 0.05, "batch_size": 16, "keep_best": False, "eval_every": 0})
    env.seed_torch("init")
    res = run_rounds(LOCAL, cfg, fed, env.model_fn(), env)
    assert all(h["bytes_up"] == 0 and h["bytes_down"] == 0 for h in res.history)
    # client 2 by hand: the seeded init, two rounds of one local epoch on its own data only
    env2 = digits_env()
    env2.seed_torch("init")
    model = env2.model_fn()
    for t in range(2):
        local_sgd(model, fed.clients[2], lr=0.05, batch_size=16, generator=env2.generator("client", 2, t))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(res.client_states[2][k], v, rtol=0, atol=0)
