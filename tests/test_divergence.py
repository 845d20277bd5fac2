"""Finite divergence (`pflkit.report.divergence`): a blow-up without a NaN is reported like one."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from pflkit.io import read_json
from pflkit.report.divergence import LOSS_GROWTH, divergence_reason, loss_growth, mark_divergence

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _method(acc: float) -> dict:
    return {"status": "ok", "acc_mean": acc, "acc_std": 0.0, "acc_sem": None, "per_seed": [acc],
            "per_client": [[acc]], "unseen": None, "error": ""}


def _result(losses: list[float], acc: float, best: float = 80.0) -> dict:
    """Method "A" with training losses ``losses`` and accuracy ``acc``; method "B" learnt normally to ``best``."""
    steady = [2.0 - i / len(losses) for i in range(len(losses))]
    return {"status": "ok", "methods": {"A": _method(acc), "B": _method(best)},
            "history": {"A": {"seed0": [{"round": i + 1, "train_loss": x} for i, x in enumerate(losses)]},
                        "B": {"seed0": [{"round": i + 1, "train_loss": x} for i, x in enumerate(steady)]}}}


BLOW_UP = [5.0] * 10 + [50.0 * (1 + i) for i in range(60)] + [1600.0] * 10  # 80 rounds, ends 320x higher


def test_windows_are_a_tenth_of_the_rounds_and_medians():
    first, last, window = loss_growth([{"train_loss": x} for x in BLOW_UP])
    assert window == 8 and first == 5.0 and last == 1600.0
    spike = [1.0] * 30
    spike[-1] = 1e6  # one round in the last window: its median does not move
    assert loss_growth([{"train_loss": x} for x in spike])[1] == 1.0
    assert loss_growth([{"train_loss": 1.0}] * 5) is None  # fewer than two windows of rounds
    assert loss_growth([{"train_loss": -3.0}] * 10) is None  # a loss that is not positive (an ELBO): no ratio


def test_a_blow_up_with_a_broken_model_is_marked_diverged_and_its_number_withheld():
    res = _result(BLOW_UP, acc=4.98)
    before = copy.deepcopy(res)
    out = mark_divergence(res)
    assert res == before  # the input is not changed
    a = out["methods"]["A"]
    assert out["status"] == "diverged" and a["status"] == "diverged"
    assert a["acc_mean"] is None and a["per_seed"] == [None]
    assert "5 (median of the first 8 rounds) -> 1.6e+03 (last 8 of 80), 320x" in a["error"]
    assert "accuracy 4.98" in a["error"] and "(B 80.00)" in a["error"]
    assert out["methods"]["B"] == res["methods"]["B"]


@pytest.mark.parametrize("losses, acc, why", [
    (BLOW_UP, 78.0, "loss grew but the model works (Per-FedAvg's meta-model loss before adaptation)"),
    ([2.0] * 80, 4.98, "the model is broken but its loss did not grow: it did not learn, it did not diverge"),
    ([5.0] * 72 + [5.0 * LOSS_GROWTH * 0.99] * 8, 4.98, "the loss grew just under the threshold"),
    ([5.0] * 75 + [1e6] + [5.0] * 4, 4.98, "one spike in the last rounds"),
])
def test_one_sign_alone_is_not_a_divergence(losses, acc, why):
    res = _result(losses, acc)
    assert divergence_reason(res, "A") is None, why
    assert mark_divergence(res) is res


def test_the_threshold_is_inclusive_and_both_signs_are_needed_together():
    res = _result([5.0] * 72 + [5.0 * LOSS_GROWTH] * 8, acc=39.9)  # 10x, and under half of 80
    assert mark_divergence(res)["methods"]["A"]["status"] == "diverged"
    assert divergence_reason(_result([5.0] * 72 + [5.0 * LOSS_GROWTH] * 8, acc=40.0), "A") is None


def test_a_method_the_runner_already_marked_keeps_its_reason():
    res = _result(BLOW_UP, acc=4.98)
    res["methods"]["A"].update(status="diverged", acc_mean=None, error="seed 0: non-finite loss (nan) in client 3")
    assert mark_divergence(res) is res


def test_the_report_shows_a_finite_divergence_with_its_evidence(tmp_path):
    from pflkit.io import write_json
    from pflkit.report.reproduction import build_report

    res = _result(BLOW_UP, acc=4.98)
    res.update(experiment="x_blowup", paper="pfedhn", table="Table 1", title="blow-up", preset="cpu",
               config={"name": "x_blowup", "seeds": 1, "published": {"A": 76.46, "B": 80.0}}, deviations=[],
               command="pflkit reproduce --preset cpu --only x_blowup")
    write_json(tmp_path / "cpu" / "x_blowup.json", res)
    text = build_report(tmp_path, with_catalog=False)
    assert "| `x_blowup` | **diverged** / 76.46 | **80.00** / 80 |" in text
    assert "Status: **diverged** (A: finite divergence: seed 0: training loss 5 " in text


@pytest.mark.skipif(not (RESULTS / "pfedhn_table3_mnist_n10.json").exists(), reason="committed results absent")
def test_committed_results_per_fedavg_meta_loss_rise_on_mnist_is_not_a_divergence():
    """Per-FedAvg (HF) on MNIST: its logged loss (the meta-model's, before adaptation) ends 20x higher,
    yet the adapted models reach 98%: the rule must leave it ok."""
    res = read_json(RESULTS / "pfedhn_table3_mnist_n10.json")
    first, last, _ = loss_growth(res["history"]["Per-FedAvg (HF)"]["seed0"])
    assert last >= LOSS_GROWTH * first
    assert mark_divergence(res)["methods"]["Per-FedAvg (HF)"]["status"] == "ok"


def test_per_fedavg_fo_on_omniglot_at_the_cifar_rate_reads_as_diverged():
    """The committed Omniglot row as it stood with Per-FedAvg (FO) at lr 0.05 (a fixture: its loss rose
    10 -> 1620 with every number finite); the row now runs FO at App. B's pick, 0.1."""
    res = read_json(FIXTURES / "omniglot_perfedavg_fo_lr0p05.json")
    assert res["methods"]["Per-FedAvg (FO)"]["status"] == "ok"  # as the run stored it: every number finite
    marked = mark_divergence(res)
    assert marked["methods"]["Per-FedAvg (FO)"]["status"] == "diverged"
    assert [k for k, m in marked["methods"].items() if m["status"] != "ok"] == ["Per-FedAvg (FO)"]


@pytest.mark.skipif(not (RESULTS / "pfedhn_table1_omniglot.json").exists(), reason="committed results absent")
def test_no_committed_result_is_marked():
    """No committed result blows up with finite numbers (Omniglot's Per-FedAvg (FO) did at lr 0.05; at
    0.1 it learns): a rule that marked one would hide a real number."""
    marked = {}
    for path in sorted(RESULTS.glob("*.json")) if RESULTS.is_dir() else []:
        if path.name.startswith("_"):
            continue
        res = read_json(path)
        out = mark_divergence(res)
        marked.update({f"{path.stem}: {k}": m["error"] for k, m in out["methods"].items()
                       if m["status"] == "diverged" and res["methods"][k]["status"] == "ok"})
    assert not marked, marked
    omniglot = read_json(RESULTS / "pfedhn_table1_omniglot.json")["methods"]["Per-FedAvg (FO)"]
    assert omniglot["status"] == "ok" and omniglot["acc_mean"] > 50
