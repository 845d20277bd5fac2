"""How sure a claim's verdict is: paired bootstrap intervals over clients, and budget-limited training.

A comparison of two methods of one run is paired over its clients: both are tested on the same clients'
test splits, so the quantity is the mean over clients of the per-client difference, and its 95% interval
comes from resampling clients (percentile bootstrap, `BOOTSTRAP` draws from a fixed generator, so a report
is reproducible). Where a row has several seeds, each seed has its own federation: the seeds are resampled
too (then the clients within each drawn seed), so seed-to-seed noise widens the interval.

A verdict reads the interval against the claim's margin (`read`): **holds** when all of it is on the
claim's side, **fails** when all of it is on the other side, **inconclusive** when it straddles the margin.
A failing comparison whose method was still learning when its training stopped reads **budget-limited**:
more rounds might turn it. Still learning (`Rise`): the best of its validation curve in the last quarter of
its rounds exceeds the best before by more than the curve's noise (its scatter around a straight line over
the last half of the rounds) and by more than `MIN_RISE`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HOLDS, FAILS, INCONCLUSIVE, BUDGET_LIMITED, NOT_RUN = "holds", "fails", "inconclusive", "budget-limited", "not run"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, BUDGET_LIMITED)
BOOTSTRAP = 2000  # bootstrap draws
LEVEL = 0.95  # two-sided interval
RISE_T = 1.0  # the last quarter's gain over this many times the curve's noise: "by more than its noise"
MIN_RISE = 0.01  # and by more than this (fraction: 1 pp), so a plateau's last wiggle never counts
MIN_POINTS = 3  # evaluated rounds needed in the last half to fit the line the noise is measured around


@dataclass(frozen=True)
class Interval:
    """Mean of the paired per-client differences (percentage points) and its bootstrap interval."""

    mean: float
    lo: float
    hi: float
    clients: int
    seeds: int

    def text(self) -> str:
        return f"{self.mean:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"


def _draws(rng: np.random.Generator, values: np.ndarray, n: int) -> np.ndarray:
    """``n`` bootstrap means of ``values`` (resampled with replacement)."""
    idx = rng.integers(0, len(values), size=(n, len(values)))
    return values[idx].mean(axis=1)


def paired_interval(a_seeds: list[list[float]], b_seeds: list[list[float]], *, draws: int = BOOTSTRAP,
                    seed: int = 0) -> Interval | None:
    """The mean per-client difference ``a - b`` with its `LEVEL` bootstrap interval.

    Args:
        a_seeds, b_seeds: per seed, the per-client values of the two methods, clients in the same order (the
            compact results' ``per_client``). A seed whose two lists differ in length (a method run on part of
            the federation) is compared unpaired: each side's clients resampled on their own.
    Returns None when no seed has values on both sides.
    """
    pairs = [(np.asarray(a, float), np.asarray(b, float)) for a, b in zip(a_seeds, b_seeds) if len(a) and len(b)]
    pairs = [(a, b) for a, b in pairs if np.isfinite(a).all() and np.isfinite(b).all()]
    if not pairs:
        return None
    rng = np.random.default_rng(seed)

    def seed_means(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        if len(a) == len(b):
            return _draws(rng, a - b, n)
        return _draws(rng, a, n) - _draws(rng, b, n)

    point = float(np.mean([a.mean() - b.mean() for a, b in pairs]))
    if len(pairs) == 1:
        boot = seed_means(*pairs[0], draws)
    else:  # seeds resampled, then clients within each drawn seed
        per_seed = np.stack([seed_means(a, b, draws) for a, b in pairs])  # (seeds, draws)
        pick = rng.integers(0, len(pairs), size=(draws, len(pairs)))
        boot = per_seed[pick, np.arange(draws)[:, None]].mean(axis=1)
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return Interval(point, float(lo), float(hi), sum(len(a) for a, _ in pairs), len(pairs))


def mean_interval(groups: list[list[float]], *, draws: int = BOOTSTRAP, seed: int = 0) -> Interval | None:
    """The mean over ``groups`` (runs) of each group's mean, with its bootstrap interval: the groups are
    resampled, then the members (clients) of each drawn group, so both the spread between runs and the one
    between a run's clients widen it (one group: its clients only; one value per group: the groups only)."""
    groups = [np.asarray(g, float) for g in groups if len(g)]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    point = float(np.mean([g.mean() for g in groups]))
    per_group = np.stack([_draws(rng, g, draws) if len(g) > 1 else np.full(draws, g[0]) for g in groups])
    if len(groups) == 1:
        boot = per_group[0]
    else:
        pick = rng.integers(0, len(groups), size=(draws, len(groups)))
        boot = per_group[pick, np.arange(draws)[:, None]].mean(axis=1)
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return Interval(point, float(lo), float(hi), sum(len(g) for g in groups), len(groups))


def range_interval(values: list[float], *, draws: int = BOOTSTRAP, seed: int = 0) -> Interval:
    """The range (max - min) of ``values`` (one run's clients) with its bootstrap interval over clients. A
    bootstrap range never exceeds the observed one, so the interval errs low: it can read fails only where
    even the observed spread is short, and holds only where most resamples keep the spread."""
    v = np.asarray(values, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(draws, len(v)))
    boot = v[idx].max(axis=1) - v[idx].min(axis=1)
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return Interval(float(v.max() - v.min()), float(lo), float(max(hi, v.max() - v.min())), len(v), 1)


def read(interval: Interval, margin: float, *, above: bool = True, strict: bool = False) -> str:
    """holds / fails / inconclusive: where ``interval`` lies against ``margin``. ``above``: the claim wants
    the quantity above the margin (else below); ``strict``: a bound equal to the margin is not enough."""
    lo, hi = (interval.lo, interval.hi) if above else (-interval.hi, -interval.lo)
    m = margin if above else -margin
    if lo > m or (lo == m and not strict):
        return HOLDS
    if hi < m or (hi == m and strict):
        return FAILS
    return INCONCLUSIVE


@dataclass(frozen=True)
class Rise:
    """How a validation curve ends: ``gain``, its best value in the last quarter of the rounds less its best
    before (``cut``: the last evaluated round before the last quarter); ``noise``, the standard deviation of
    the curve around its least-squares line over the last half of the rounds; ``slope``, that line's slope
    per 100 rounds. In the curve's units (fraction of accuracy, or of loss)."""

    gain: float
    noise: float
    slope: float
    cut: int
    last: int
    kind: str = "accuracy"  # or "loss": the curve is minus the validation loss

    @property
    def rising(self) -> bool:
        """Still rising by more than its noise (and by more than `MIN_RISE`)."""
        gain = round(self.gain, 9)  # 0.61 - 0.60 is 1 pp, not a hair more
        return gain > RISE_T * self.noise and gain > MIN_RISE

    def text(self) -> str:
        if self.kind == "loss":
            return (f"validation loss still falling when training stopped: best {self.gain:.3f} lower after round "
                    f"{self.cut} of {self.last} than before (noise {self.noise:.3f}; slope {-self.slope:+.3f} "
                    f"per 100 rounds over the last half)")
        return (f"validation accuracy still rising when training stopped: best {100 * self.gain:+.1f} pp after "
                f"round {self.cut} of {self.last} (noise {100 * self.noise:.1f} pp; slope {100 * self.slope:+.1f} pp "
                f"per 100 rounds over the last half)")


def curve(history: dict | None) -> tuple[dict[int, float], str]:
    """(mean over seeds of the validation curve per evaluated round, its kind): ``val_acc`` where recorded
    ("accuracy"), else minus ``client_val_loss`` ("loss": FedL2P's meta rounds record the sampled clients'
    validation loss); higher is better either way."""
    rows = [row for seed in (history or {}).values() for row in seed or []]
    kind = "accuracy" if any(row.get("val_acc") is not None for row in rows) else "loss"
    by_round: dict[int, list[float]] = {}
    for row in rows:
        r, v = row.get("round"), row.get("val_acc" if kind == "accuracy" else "client_val_loss")
        if r is not None and v is not None and math.isfinite(float(v)):
            by_round.setdefault(int(r), []).append(float(v) if kind == "accuracy" else -float(v))
    return {r: sum(v) / len(v) for r, v in sorted(by_round.items())}, kind


def rise(points: dict[int, float], kind: str = "accuracy") -> Rise | None:
    """The `Rise` of ``points`` (round -> value, higher is better); None with fewer than `MIN_POINTS`
    evaluated rounds in the last half or none before the last quarter."""
    if not points:
        return None
    last = max(points)
    early = {r: v for r, v in points.items() if r <= 0.75 * last}
    late = {r: v for r, v in points.items() if r > 0.75 * last}
    half = {r: v for r, v in points.items() if r > 0.5 * last}
    if not early or not late or len(half) < MIN_POINTS:
        return None
    x, y = np.array(list(half), float), np.array(list(half.values()), float)
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (slope * x + icpt)
    noise = math.sqrt(float((resid ** 2).sum()) / max(len(x) - 2, 1))
    return Rise(max(late.values()) - max(early.values()), noise, 100 * float(slope), max(early), last, kind)


def combine(verdicts: list[str]) -> str:
    """A claim over several rows: fails when any row fails, else budget-limited when any is, else
    inconclusive when any is, else holds."""
    for v in (FAILS, BUDGET_LIMITED, INCONCLUSIVE):
        if v in verdicts:
            return v
    return HOLDS if verdicts else NOT_RUN


def still_learning(history: dict | None) -> Rise | None:
    """The `Rise` of a method's validation curve (`curve`) when it is still rising by more than its noise,
    else None."""
    r = rise(*curve(history))
    return r if r is not None and r.rising else None
