"""FedSelect's claim (Tamirisa et al.), checked on compact results: every FedSelect row beats FedAvg and
LG-FedAvg at s = 2 (Table 1), with client masks that differ (Fig. 1). Built from `pflkit.report.claims`.
"""
from __future__ import annotations

import re

from pflkit.report.claims import (ClaimResult, Results, acc, claim, claim_result, judge, labels, matching,
                                  not_compared, published, rows_text, tally, with_clause, worst, worst_failure)
from pflkit.report.findings import finding
from pflkit.report.verdicts import FAILS, HOLDS, NOT_RUN, combine

FEDSELECT_ROW = re.compile(r"^FedSelect \(\d")  # the paper's FedSelect rows, one per personalization rate
ROW_SEP = ", "  # "experiment, method" names a compared row


def _mask_iou(res: dict, label: str) -> float | None:
    a = res.get("analysis", {}).get(label) or {}
    vals = [s["mask_iou"] for s in a.get("seeds", []) if s.get("mask_iou") is not None]
    return sum(vals) / len(vals) if vals else a.get("mask_iou")


@claim("fedselect", "FedSelect beats FedAvg and LG-FedAvg at s = 2, with masks that differ across clients")
def fedselect_beats_fedavg_lg(results: Results) -> ClaimResult:
    """Table 1, s = 2: every FedSelect row (p = 0.25, 0.5, 0.75) above FedAvg and LG-FedAvg; Fig. 1:
    the clients' masks differ (mean pairwise IoU < 1), checked when a run records it."""
    rivals = ("FedAvg", "LG-FedAvg")

    def rows(value):
        out = []
        for name, res in matching(results, "fedselect_*_s2"):
            for label in (k for k in labels(res) if FEDSELECT_ROW.match(k)):
                out += [(f"{name}{ROW_SEP}{label}", value(res, label), r, value(res, r)) for r in rivals
                        if value(res, label) is not None and value(res, r) is not None]
        return out

    ours, paper = rows(acc), rows(published)
    fn = fedselect_beats_fedavg_lg
    paper_value = f"FedSelect above in {tally(paper, lambda a, b: a > b)} comparisons" if paper else "-"
    left_out = not_compared(results, "fedselect_*_s2", lambda k: k in rivals or bool(FEDSELECT_ROW.match(k)))
    if not ours:
        return claim_result(fn, NOT_RUN, paper_value, "-",
                            f"no s = 2 result with FedSelect and FedAvg / LG-FedAvg{left_out}")
    judged = [judge(results[row.split(ROW_SEP, 1)[0]], row, row.split(ROW_SEP, 1)[1], rival, a, b, 0.0, True,
                    lambda x, y: x > y) for row, a, rival, b in ours]
    failed = [r for r in ours if not r[1] > r[3]]
    ious = {f"{n}:{k}": v for n, res in matching(results, "fedselect_*_s2") for k in res.get("methods", {})
            if FEDSELECT_ROW.match(k) and (v := _mask_iou(res, k)) is not None}
    same = [k for k, v in ious.items() if v >= 1.0]
    reason = (f"{len(failed)} of {len(ours)} comparisons fail, worst "
              f"{worst_failure(results, failed, lambda row: row.split(ROW_SEP, 1))}" if failed
              else f"all {len(ours)} comparisons")
    reason += f"; masks identical across clients in {', '.join(same)}" if same else \
        "; masks differ (IoU < 1)" if ious else "; mask IoU not recorded"
    reason += left_out
    ours_text = f"above in {tally(ours, lambda a, b: a > b)}; {worst(ours)}"
    if ious:
        ours_text += f"; mask IoU {min(ious.values()):.2f}-{max(ious.values()):.2f}"
    interval, limited = rows_text(judged)
    verdict = combine([r.verdict for r in judged] + ([FAILS] if same else []))
    if verdict != HOLDS:
        reason = with_clause(reason, finding('fedselect_beats_fedavg_lg', results))
    return claim_result(fn, verdict, paper_value, ours_text, reason + limited, interval, judged)
