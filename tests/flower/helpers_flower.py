"""The tiny experiment the Flower adapter tests share (digits, 4 clients, about a second per stage)."""
from __future__ import annotations

import copy

import pytest

REL = 1e-6  # the same operations in the same order; only the process differs

# FedAvg pretraining, then the four papers' methods and a fine-tuning baseline; sizes are tiny
# but every phase runs: keep-best validation, caching (FedL2P samples 3 of 4 clients twice),
# pFedHN's generated weights, FedSelect's masks, pFedVEM's client posteriors.
RAW = {
    "experiment": {"name": "flower_check", "paper": "test"},
    "data": {"dataset": "digits", "scheme": "dirichlet", "num_clients": 4, "partition": {"alpha": 0.5}},
    "model": {"name": "digits_cnn"},
    "pretrain": {"label": "FedAvg", "algorithm": "fedavg", "rounds": 2, "fraction": 0.5, "lr": 0.05,
                 "batch_size": 16, "eval_every": 1},
    "methods": {
        "FedL2P": {"algorithm": "fedl2p", "rounds": 2, "fraction": 0.75, "epochs": 1, "meta_iters": 1,
                   "lr": 0.05, "batch_size": 16},
        "pFedHN": {"algorithm": "pfedhn", "rounds": 1, "fraction": 0.25, "local_steps": 2, "batch_size": 16,
                   "eval_every": 1},
        "FedSelect": {"algorithm": "fedselect", "rounds": 2, "fraction": 0.5, "local_epochs": 1,
                      "ltn_iterations": 1, "ltn_epochs": 1, "batch_size": 16},
        "pFedVEM": {"algorithm": "pfedvem", "rounds": 2, "fraction": 0.5, "local_epochs": 1, "head_steps": 2,
                    "batch_size": 16, "report_fraction": 0.0},
        "FT": {"algorithm": "finetune", "bn": "none", "epochs": 1},
    },
}


def experiment(methods=None, extra=None, **changes):
    """RAW keeping only the ``methods`` labels, plus ``extra`` methods and top-level ``changes``; preset smoke."""
    from pflkit.run.experiments import resolve

    raw = copy.deepcopy(RAW)
    if methods is not None:
        raw["methods"] = {k: v for k, v in raw["methods"].items() if k in methods}
    raw["methods"].update(copy.deepcopy(extra or {}))
    raw.update(changes)
    return resolve(raw, "smoke")


def rounded(x):
    """``x`` without its ``seconds`` entries and with floats to 6 significant digits: what two runs of the
    same thing on different processes or machines have in common."""
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return float(f"{x:.6g}") if isinstance(x, float) else x


def assert_same_run(loop: dict, flower: dict, label: str) -> None:
    """History (losses, validation, schedule) and every client's test metrics, to float tolerance."""
    a, b = loop["rounds"][label]["seed0"], flower["rounds"][label]["seed0"]
    assert len(a) == len(b) > 0 or label == "FT"
    for ra, rb in zip(a, b):
        assert rb["clients"] == ra["clients"] and rb["failed"] == []
        for key in ("train_loss", "val_acc", "val_loss"):
            assert (ra.get(key) is None) == (rb.get(key) is None), key
            if ra.get(key) is not None:
                assert rb[key] == pytest.approx(ra[key], rel=REL), (label, ra["round"], key)
    ma, mb = loop["methods"][label], flower["methods"][label]
    assert mb["status"] == ma["status"] == "ok"
    assert mb["best_round"] == ma["best_round"]
    assert mb["per_client"] == [pytest.approx(x, rel=REL) for x in ma["per_client"]]
