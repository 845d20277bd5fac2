"""What the algorithm tests share: the small MLP on sklearn digits, a model at its seeded start, the two
federations most of them train on, and the round settings of tests that compare methods round by round.

Plain functions (imported as ``from tests.algorithms.conftest import ...``, as ``tests.conftest``'s ``TOL``
is): each test module keeps its own ``fed`` fixture, one line naming which federation it trains on.
"""
from __future__ import annotations

from pflkit.fl.algorithm import Env
from pflkit.fl.federate import build_federation
from pflkit.fl.federation import Federation
from pflkit.models import build_model
from tests.helpers_data import digits_dataset

# One SGD setting for tests that compare two methods on the same federation (Ditto vs FedAvg, FedBABU):
# full participation, no validation, the last round kept, so the two runs differ only in the method.
SGD_ROUNDS = {"rounds": 2, "fraction": 1.0, "lr": 0.05, "momentum": 0.9, "batch_size": 10, "local_epochs": 1,
              "eval_every": 0, "keep_best": False}


def mlp_env(seed: int = 0) -> Env:
    """An `Env` over a one-hidden-layer MLP (16 units) for digits' 8 x 8 images: a network small enough for
    hand computations of its gradients and Hessian-vector products."""
    return Env(model_fn=lambda: build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=(16,)), seed=seed)


def init_model(env: Env):
    """``env``'s model at its seeded initialization: every call gives the same weights for the same seed."""
    env.seed_torch("init")
    return env.model_fn()


def pathological_fed(num_clients: int) -> Federation:
    """Two classes per client over digits (about 1400 / ``num_clients`` training samples each)."""
    return build_federation(digits_dataset(), "pathological", num_clients, seed=0, classes_per_client=2)


def shards_fed(num_clients: int) -> Federation:
    """Two-class shards of 20 training and 15 test samples per class, the test split paired with the train
    split's classes and no validation split: personalization has a clear advantage to show."""
    return build_federation(digits_dataset(), "shards", num_clients, seed=0, split="paired", val_fraction=0.0,
                            classes_per_client=2, samples_per_class=(20, 15))


def head_sharing_cfg(algo, **kw):
    """Four rounds of half the clients, three local steps, validation every second round: the setting of
    the tests of methods that split the model into a shared and a local part (FedPer, LG-FedAvg)."""
    return algo.make_config({"rounds": 4, "fraction": 0.5, "lr": 0.05, "local_steps": 3, "eval_every": 2, **kw})
