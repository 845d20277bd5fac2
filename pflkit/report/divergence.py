"""Finite divergence: a method whose training blew up without a NaN, read from a saved run's history.

The runner marks a method ``diverged`` when a loss, weight or buffer becomes non-finite
(`pflkit.fl.loop`). A run can also diverge with every number finite: the training loss climbs by
orders of magnitude and the model that comes out is broken. `mark_divergence` finds that case in
a result (``results.json`` or its compact form) and gives the method the same ``diverged`` status,
its accuracies withheld like the runner's, and an ``error`` that shows the evidence: the loss at the
start and at the end, and the accuracy the broken model reached.

Both of two signs are required, because either alone misleads:
- the training loss grew: the median over the last tenth of the logged rounds is at least
  `LOSS_GROWTH` times the median over the first tenth (at least `WINDOW` rounds each, so one spike
  does not count). Alone it is not enough: Per-FedAvg logs the loss of the meta-model before
  adaptation, which may rise while the adapted models are good (MNIST, 98%);
- the model is broken: its accuracy is below `BROKEN_FRACTION` of the best ``ok`` method's of the
  same run. Alone it is not enough either: a method may simply not learn (a result, not a divergence).

The rule reads the stored history only, so it applies to results made before it existed; it lives
in the report, which does not change a run's code version (`pflkit.batch.versions.NOT_RUN_CODE`).
"""
from __future__ import annotations

import copy
import statistics

__all__ = ["LOSS_GROWTH", "BROKEN_FRACTION", "WINDOW", "loss_growth", "divergence_reason", "mark_divergence"]

LOSS_GROWTH = 10.0  # last-window median / first-window median of the training loss
BROKEN_FRACTION = 0.5  # the method's accuracy / the best ok method's of the same run
WINDOW = 3  # the fewest rounds in each window (else a tenth of the logged rounds)


def _history(res: dict) -> dict:
    """``{label: {"seed<s>": [round records]}}``: ``history`` in a compact result, ``rounds`` in ``results.json``."""
    return res.get("history") or res.get("rounds") or {}


def loss_growth(rounds: list[dict]) -> tuple[float, float, int] | None:
    """(median training loss over the first window, over the last window, window size) of one seed's
    round records; None when fewer than two windows of losses were logged, or when the first window holds
    a loss that is not positive and finite (no ratio to take)."""
    losses = [r["train_loss"] for r in rounds if isinstance(r, dict) and isinstance(r.get("train_loss"), (int, float))]
    window = max(WINDOW, len(losses) // 10)
    if len(losses) < 2 * window or any(not 0 < x < float("inf") for x in losses[:window]):
        return None
    return statistics.median(losses[:window]), statistics.median(losses[-window:]), window


def _best_other(res: dict, label: str) -> tuple[str, float] | None:
    ok = {k: m["acc_mean"] for k, m in res.get("methods", {}).items()
          if k != label and m.get("status") == "ok" and m.get("acc_mean") is not None}
    return max(ok.items(), key=lambda kv: kv[1]) if ok else None


def divergence_reason(res: dict, label: str) -> str | None:
    """Why method ``label`` of result ``res`` diverged with finite numbers (module docstring), or None."""
    m = res.get("methods", {}).get(label) or {}
    best = _best_other(res, label)
    if m.get("status") != "ok" or m.get("acc_mean") is None or best is None:
        return None
    if m["acc_mean"] >= BROKEN_FRACTION * best[1]:
        return None
    grown = []
    for seed, rounds in (_history(res).get(label) or {}).items():
        g = loss_growth(rounds) if isinstance(rounds, list) else None
        if g and g[1] >= LOSS_GROWTH * g[0]:
            n = sum(1 for r in rounds if isinstance(r, dict) and "train_loss" in r)
            grown.append(f"{seed.replace('seed', 'seed ')}: training loss {g[0]:.3g} (median of the first {g[2]} "
                         f"rounds) -> {g[1]:.3g} (last {g[2]} of {n}), {g[1] / g[0]:.0f}x")
    if not grown:
        return None
    return (f"finite divergence: {'; '.join(grown)}; accuracy {m['acc_mean']:.2f}, less than "
            f"{BROKEN_FRACTION:g} x the best method's ({best[0]} {best[1]:.2f})")


def mark_divergence(res: dict) -> dict:
    """``res`` with every method that diverged with finite numbers (`divergence_reason`) marked as the
    runner marks a non-finite one: status ``diverged``, accuracies withheld, the reason in ``error``;
    the result's status becomes ``diverged``. ``res`` itself is not changed."""
    reasons = {k: r for k in res.get("methods", {}) if (r := divergence_reason(res, k))}
    if not reasons:
        return res
    out = copy.deepcopy(res)
    for label, reason in reasons.items():
        m = out["methods"][label]
        m.update(status="diverged", acc_mean=None, acc_std=None, acc_sem=None, unseen=None,
                 per_seed=[None] * len(m.get("per_seed") or []),
                 error="; ".join(e for e in (m.get("error"), reason) if e))
    out["status"] = "diverged"  # the worst status there is (`pflkit.run.results.STATUS_ORDER`)
    return out
