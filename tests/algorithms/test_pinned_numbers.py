"""Refactors keep the numbers: two rounds of each algorithm against values recorded before a clean-up.

The values were recorded at commit b2e69e1, before the local-SGD helper (`pflkit.fl.train.round_sgd`),
FedAvg-built phases (Per-FedAvg, FedBABU, pFedMe) and shared configs. Every case sets momentum,
weight decay, clipping and a learning-rate milestone, so a keyword lost on the way, another
generator key or another order of the batches moves these sums far beyond the tolerance. To re-record
after a change that is *meant* to move numbers: ``python -m tests.algorithms.test_pinned_numbers``.
"""
from __future__ import annotations

import math

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from tests.helpers_data import digits_dataset, digits_env

COMMON = {"rounds": 2, "fraction": 1.0, "batch_size": 16, "eval_every": 1, "keep_best": False, "momentum": 0.5,
          "weight_decay": 1e-3, "max_grad_norm": 5.0, "lr_milestones": (1,), "lr": 0.05}
CASES = {  # case: (algorithm, its settings)
    "fedavg_steps": ("fedavg", {"local_steps": 3}),
    "fedavg_broadcast": ("fedavg", {"participation": "broadcast", "report_fraction": 0.5}),
    "local": ("local", {}),
    "finetune": ("finetune", {"epochs": 1, "bn": "none"}),
    "ditto": ("ditto", {"local_epochs": 1, "lam": 0.5}),
    "fedbabu_head": ("fedbabu", {"local_epochs": 1, "finetune_epochs": 1, "finetune_part": "head",
                                 "finetune_lr": 0.02}),
    "fedper_broadcast": ("fedper", {"local_epochs": 1, "participation": "broadcast", "report_fraction": 0.5}),
    "perfedavg_hf": ("perfedavg_hf", {"local_steps": 2}),
    "pfedme": ("pfedme", {"local_steps": 2, "inner_steps": 2, "beta": 0.7}),
    "pfedme_last": ("pfedme", {"local_steps": 2, "inner_steps": 1, "eval_mode": "last", "participation": "broadcast",
                               "report_fraction": 0.5}),
    "pfedhn_pc": ("pfedhn_pc", {"local_steps": 3, "fraction": 0.5}),
    "fedselect": ("fedselect", {"local_epochs": 2, "ltn_iterations": 1, "ltn_epochs": 1}),
    "fedrep": ("fedrep", {"local_epochs": 2}),
    "lotteryfl": ("lotteryfl", {"local_epochs": 1, "acc_threshold": 0.0, "prune_split": "train"}),
    "pfedvem_steps": ("pfedvem", {"local_steps": 2, "head_steps": 2, "participation": "broadcast",
                                  "report_fraction": 0.5, "predict": "mc", "eval_mc": 3}),
    "pfedmap": ("pfedmap", {"local_epochs": 1, "head_steps": 2, "participation": "sampled"}),
}

# case: (sum |server state|, sum |client states|, correct test predictions, summed client test losses)
PINNED = {
    "fedavg_steps": (651.3318696166211, 0.0, 22, 9.03128178914388),
    "fedavg_broadcast": (658.1768067422338, 0.0, 18, 9.064221954345703),
    "local": (676.4784386296819, 2633.5947314719756, 65, 8.728068288167318),
    "finetune": (676.4784386296819, 0.0, 70, 8.785513305664065),
    "ditto": (658.096636343786, 2633.4858699066212, 73, 8.733957417805989),
    "fedbabu_head": (658.0593920036863, 0.0, 59, 8.937462107340494),
    "fedper_broadcast": (658.1018305941532, 114.93800371427642, 65, 8.765116755167643),
    "perfedavg_hf": (632.850141928559, 0.0, 27, 8.95474967956543),
    "pfedme": (653.8341993115986, 0.0, 56, 8.929594167073567),
    "pfedme_last": (658.1148050313166, 2632.570721588402, 31, 9.03129628499349),
    "pfedhn_pc": (73097.49297085716, 351.15466240999376, 45, 8.897945404052734),
    "fedselect": (645.9222430932559, 2584.6020622200863, 72, 8.638130823771158),
    "fedrep": (645.9942524075091, 2584.5143711197125, 59, 8.678815333048503),
    "lotteryfl": (660.1123785962006, 5284.515841475368, 28, 9.026425679524738),
    "pfedvem_steps": (666.9858009580867, 866.0408916289525, 60, 4.074645042419434),
    "pfedmap": (658.2688579829573, 115.18287090273225, 57, 8.806955210367839),
}
REL = 1e-6  # far below what another batch order, generator key or lost keyword moves (>= 1e-3 here)


def _abs_sum(x) -> float:
    if isinstance(x, torch.Tensor):
        return float(x.detach().double().abs().sum()) if x.is_floating_point() else 0.0
    if isinstance(x, dict):
        return sum(_abs_sum(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_abs_sum(v) for v in x)
    return 0.0


def federation():
    return build_federation(digits_dataset(), "shards", 4, seed=0, split="paired", val_fraction=0.2,
                            classes_per_client=2, samples_per_class=(20, 15))


def numbers(case: str, fed) -> tuple[float, float, int, float]:
    """Two rounds of ``case`` from the seeded initial model, then the test pass."""
    name, settings = CASES[case]
    algo = ALGORITHMS[name]
    env = digits_env()
    env.seed_torch("init")
    res = run_rounds(algo, algo.make_config({**COMMON, **settings}), fed, env.model_fn(), env)
    assert res.status == "ok", res.error
    return (_abs_sum(res.state), _abs_sum(res.client_states), sum(m["correct"] for m in res.per_client.values()),
            sum(m["loss"] for m in res.per_client.values()))


@pytest.fixture(scope="module")
def fed():
    return federation()


@pytest.mark.parametrize("case", sorted(CASES))
def test_numbers_are_those_recorded_before_the_refactor(case, fed):
    got, want = numbers(case, fed), PINNED[case]
    assert got[2] == want[2], f"{case}: correct predictions {got[2]} != {want[2]}"
    for what, g, w in zip(("server state", "client states", "test loss"), (got[0], got[1], got[3]),
                          (want[0], want[1], want[3])):
        assert math.isclose(g, w, rel_tol=REL, abs_tol=1e-9), f"{case}: {what} {g!r} != {w!r}"


if __name__ == "__main__":  # print a fresh PINNED table (one thread, as tests/conftest.py sets)
    torch.set_num_threads(1)
    f = federation()
    for c in CASES:
        print(f"    {c!r}: {numbers(c, f)!r},")
