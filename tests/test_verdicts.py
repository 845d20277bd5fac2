"""The verdict rules of `pflkit.report.verdicts`, on synthetic per-client accuracies: a claim reads holds,
fails, inconclusive or budget-limited from the paired 95% bootstrap interval of the mean per-client difference
(seeds too) and from how the method's validation curve ended."""
from __future__ import annotations

import numpy as np
import pytest

from pflkit.report import verdicts as vd
from pflkit.report.fedl2p import claims as cl

N = 30  # clients


def clients(mean: float, spread: float, seed: int, n: int = N) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, spread, n))


def row(ft: list[list[float]], fedl2p: list[list[float]], history=None) -> dict:
    """A FedL2P table row whose per-client accuracies (per seed) are given; FT (BN G) is the only rival."""
    mean = lambda seeds: float(np.mean([np.mean(s) for s in seeds]))  # noqa: E731
    res = {"methods": {"FT (BN G)": {"status": "ok", "acc_mean": mean(ft), "per_client": ft, "published": 75.0},
                       "FedL2P": {"status": "ok", "acc_mean": mean(fedl2p), "per_client": fedl2p,
                                  "published": 76.0}},
           "analysis": {}, "config": {"data": {"dataset": "cifar10", "scheme": "dirichlet"}}}
    if history:
        res["history"] = {"FedL2P": history}
    return res


def rising_history(gain: float) -> dict:
    """Minus-validation-loss curve that climbs by ``gain`` per round to the last of 20 rounds (0: a plateau)."""
    return {"seed0": [{"round": r, "client_val_loss": 1.0 - gain * r} for r in range(1, 21)]}


BASE = clients(70.0, 8.0, 0)


@pytest.mark.parametrize("shift, spread, verdict", [
    (+3.0, 1.0, "holds"),          # interval well above the -1 pp margin
    (-5.0, 1.0, "fails"),          # interval wholly below it
    (-1.0, 6.0, "inconclusive"),   # per-client differences so scattered that the interval straddles -1
])
def test_a_paired_interval_reads_holds_fails_or_inconclusive(shift, spread, verdict):
    fedl2p = [list(np.array(BASE) + np.array(clients(shift, spread, 1)))]
    c = cl.fedl2p_matches_best_ft({"fedl2p_table2_a0p1_e5": row([BASE], fedl2p)})
    assert c.verdict == verdict, c
    (r,) = c.rows
    assert r.interval.clients == N and r.interval.lo <= r.interval.mean <= r.interval.hi
    assert r.interval.mean == pytest.approx(shift, abs=3 * spread / np.sqrt(N))
    assert "fedl2p_table2_a0p1_e5: FedL2P - FT (BN G)" in c.interval and f"1 {verdict}" in c.interval


def test_a_failing_row_still_learning_reads_budget_limited_with_its_slope():
    fedl2p = [list(np.array(BASE) + np.array(clients(-5.0, 1.0, 1)))]
    res = {"fedl2p_table2_a0p1_e5": row([BASE], fedl2p, rising_history(0.02))}
    c = cl.fedl2p_matches_best_ft(res)
    assert c.verdict == "budget-limited", c
    assert "validation loss still falling when training stopped" in c.reason and "slope" in c.reason
    res["fedl2p_table2_a0p1_e5"] = row([BASE], fedl2p, rising_history(0.0))  # a plateau: it fails
    assert cl.fedl2p_matches_best_ft(res).verdict == "fails"
    # budget-limited only excuses a failing row: an inconclusive one stays inconclusive, one that fails outright
    # elsewhere makes the claim fail
    res["fedl2p_table2_a1p0_e5"] = row([BASE], fedl2p, rising_history(0.02))
    assert cl.fedl2p_matches_best_ft(res).verdict == "fails"


def test_no_row_fails_where_its_interval_straddles_its_margin():
    rng = np.random.default_rng(5)
    for k in range(40):
        ft = [clients(70, 8, 100 + k)]
        fedl2p = [list(np.array(ft[0]) + rng.normal(rng.uniform(-4, 2), rng.uniform(0.5, 8), N))]
        for r in cl.fedl2p_matches_best_ft({"fedl2p_x": row(ft, fedl2p)}).rows:
            iv = r.interval
            assert r.verdict != "fails" or iv.hi < r.margin
            assert r.verdict != "holds" or iv.lo >= r.margin
            assert r.verdict != "inconclusive" or iv.lo < r.margin <= iv.hi


def test_pairing_and_seeds():
    a = clients(70, 10, 0)
    b = list(np.array(a) - 2 + np.array(clients(0, 0.5, 1)))  # b tracks a client for client
    paired = vd.paired_interval([a], [b])
    unpaired = vd.paired_interval([a], [b[:-1]])  # lengths differ: resampled apart
    assert paired.hi - paired.lo < (unpaired.hi - unpaired.lo) / 5
    assert vd.paired_interval([a], [b]) == paired  # a fixed generator: the same interval every time
    # two seeds that disagree: the seed-level resampling widens the interval beyond either seed's
    b2 = list(np.array(a) + 2 + np.array(clients(0, 0.5, 2)))
    both = vd.paired_interval([a, a], [b, b2])
    assert both.seeds == 2 and both.mean == pytest.approx(0.0, abs=0.3) and both.hi - both.lo > 3.5
    assert vd.paired_interval([[]], [[]]) is None


@pytest.mark.parametrize("lo, hi, margin, strict, verdict", [
    (0.5, 2.0, 0.0, True, "holds"), (0.0, 2.0, 0.0, True, "inconclusive"), (0.0, 2.0, 0.0, False, "holds"),
    (-3.0, -1.5, -1.0, False, "fails"), (-1.5, -0.5, -1.0, False, "inconclusive")])
def test_read_against_the_margin(lo, hi, margin, strict, verdict):
    assert vd.read(vd.Interval((lo + hi) / 2, lo, hi, 10, 1), margin, strict=strict) == verdict


def test_below_a_threshold():
    iv = vd.Interval(0.1, 0.05, 0.15, 10, 1)
    assert vd.read(iv, 0.2, above=False) == "holds" and vd.read(iv, 0.12, above=False) == "inconclusive"
    assert vd.read(iv, 0.04, above=False) == "fails"


def test_rise_on_synthetic_curves():
    rng = np.random.default_rng(0)
    rising = {r: 0.3 + 0.001 * r + rng.normal(0, 0.003) for r in range(10, 401, 10)}
    flat = {r: 0.6 + rng.normal(0, 0.02) for r in range(10, 401, 10)}
    assert vd.rise(rising).rising and vd.rise(rising).slope == pytest.approx(0.1, abs=0.02)
    assert not vd.rise(flat).rising
    assert vd.rise({100: 0.1, 400: 0.9}) is None  # too few points to tell its noise


@pytest.mark.parametrize("verdicts, claim", [(["holds", "inconclusive"], "inconclusive"),
                                             (["budget-limited", "inconclusive"], "budget-limited"),
                                             (["fails", "budget-limited"], "fails"), (["holds"], "holds"),
                                             ([], "not run")])
def test_combine(verdicts, claim):
    assert vd.combine(verdicts) == claim


def test_a_fedl2p_finding_gives_what_is_measured_not_typed_in():
    """The finding of a failing FedL2P claim: the BN layers the runs' analysis records, BNNet's sensitivity at
    App. E's init computed for that many layers, and the meta rounds against the paper preset's."""
    from pflkit.report.findings import bnnet_sensitivity, finding

    res = {"methods": {"FedL2P": {}}, "config": {"methods": [{"algorithm": "fedl2p", "rounds": 20}]},
           "analysis": {"FedL2P": {"seeds": [{"beta_per_layer": {"bn1": 0.1, "bn2": 0.0, "bn3": 0.2}}]}}}
    text = finding("fedl2p_beta_per_client", {"fedl2p_table3_digits_a0p1": res})
    assert f"input sensitivity of {bnnet_sensitivity(3):.1e} per unit of xi" in text
    assert "the model has 3 BN layers instead of ResNet-18's 20" in text
    assert "20 meta rounds instead of the paper's 500" in text  # the experiment file's paper preset
    assert 1e-5 < bnnet_sensitivity(3) < 1e-2  # App. E's gain 0.1 in all three layers: a small sensitivity
    assert finding("pfedhn_beats_baselines_n50", {}) == ""  # nothing measured: nothing said
