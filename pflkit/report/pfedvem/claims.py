"""pFedVEM's claim (Zhu, Ma, Blaschko, FL-NeurIPS'22), checked on compact results: pFedVEM is the best method
under label concept drift (Table 1). Built from `pflkit.report.claims`.
"""
from __future__ import annotations

from pflkit.report.claims import ClaimResult, Results, claim, pairwise
from pflkit.report.findings import finding

@claim("pfedvem", "pFedVEM is the best method under label concept drift")
def pfedvem_best_under_drift(results: Results) -> ClaimResult:
    """Table 1: pFedVEM's row is the highest of each column (its own variants are not rivals)."""
    return pairwise(pfedvem_best_under_drift, results, "pfedvem_*", "pFedVEM",
                    lambda k: not k.startswith("pFedVEM"), lambda a, b: a >= b, "pFedVEM best",
                    finding=finding("pfedvem_best_under_drift", results))
