"""LotteryFL: magnitude pruning to zero, rewinding to theta_0, pruned entries frozen and not sent."""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.lotteryfl import LOTTERYFL, prunable_names, prune, rewind
from pflkit.config import ConfigError
from pflkit.fl.loop import run_rounds
from tests.algorithms.conftest import shards_fed
from tests.helpers_data import digits_env


def test_prune_drops_the_smallest_magnitudes_by_hand():
    w = {"a": torch.tensor([0.5, -3.0, 0.1, 2.0]), "b": torch.tensor([[-0.2, 4.0]])}
    keep = {"a": torch.tensor([True, True, True, False]), "b": torch.tensor([[True, True]])}
    # 5 kept entries, step 0.4 -> keep 3 largest |w| among them: -3, 4 and 0.5; drop 0.1 and -0.2
    out = prune(w, keep, ["a", "b"], 0.4)
    assert out["a"].tolist() == [True, True, False, False] and out["b"].tolist() == [[False, True]]
    init = {"a": torch.ones(4), "b": torch.ones(1, 2), "bias": torch.ones(2)}
    r = rewind(init, out)
    assert r["a"].tolist() == [1, 1, 0, 0] and r["b"].tolist() == [[0, 1]] and r["bias"].tolist() == [1, 1]


@pytest.fixture(scope="module")
def fed():
    return shards_fed(3)


def _run(fed, rounds, **kw):
    env = digits_env()
    env.seed_torch("init")
    cfg = LOTTERYFL.make_config({"rounds": rounds, "fraction": 1.0, "lr": 0.05, "momentum": 0.9, "batch_size": 10,
                                 "local_epochs": 1, "eval_every": 0, "keep_best": False, "weight_decay": 1e-3, **kw})
    return run_rounds(LOTTERYFL, cfg, fed, env.model_fn(), env), env


def test_pruning_schedule_and_pruned_entries_stay_zero(fed):
    res, env = _run(fed, 4, acc_threshold=0.0, prune_step=0.2, prune_target=0.3)
    names = prunable_names(env.model_fn())
    total = sum(env.model_fn().state_dict()[n].numel() for n in names)
    # a client prunes 20% of what is left whenever its accuracy beats 0, until 30% is reached:
    # 0 -> 0.2 -> 0.36, then never again (an untrained model may score exactly 0 and wait a round)
    shares = sorted(1 - sum(int(cs["travel"][n].sum()) for n in names) / total for cs in res.client_states.values())
    for s in shares:
        assert min(abs(s - v) for v in (0.0, 0.2, 0.36)) < 1e-3
    assert shares[-1] == pytest.approx(0.36, abs=1e-3)
    for cs in res.client_states.values():
        for n in names:
            assert not cs["weights"][n][~cs["travel"][n]].any()
    total = sum(p.numel() * 4 for p in env.model_fn().state_dict().values())
    assert res.history[-1]["bytes_up"] < 0.8 * total * fed.num_clients


def test_no_pruning_below_the_accuracy_threshold(fed):
    res, _ = _run(fed, 1, acc_threshold=1.0)
    assert res.history[0]["client_pruned_share"] == 0.0


def test_registry_and_bad_settings():
    assert ALGORITHMS["lotteryfl"] is LOTTERYFL
    for key, value in (("prune_step", 1.0), ("prune_target", 1.0), ("acc_threshold", 2.0), ("prune_split", "test")):
        with pytest.raises(ConfigError, match=key):
            LOTTERYFL.make_config({key: value})
