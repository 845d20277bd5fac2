"""pFedHN's claims (Shamsian et al., ICML 2021), checked on compact results: pFedHN-PC at least matches
pFedHN, and pFedHN beats every baseline at 50 clients (Table 1). Built from `pflkit.report.claims`.
"""
from __future__ import annotations

from pflkit.report.claims import MATCH_TOL, ClaimResult, Results, claim, pairwise
from pflkit.report.findings import finding

@claim("pfedhn", "pFedHN-PC at least matches pFedHN")
def pfedhn_pc_matches(results: Results) -> ClaimResult:
    """Table 1: the personalized classifier variant is at or above pFedHN (within `MATCH_TOL`)."""
    return pairwise(pfedhn_pc_matches, results, "pfedhn_*", "pFedHN-PC", lambda k: k == "pFedHN",
                    lambda a, b: a >= b - MATCH_TOL, f"pFedHN-PC >= pFedHN - {MATCH_TOL:g}", margin=-MATCH_TOL,
                    finding=finding("pfedhn_pc_matches", results))


@claim("pfedhn", "pFedHN beats every baseline at 50 clients")
def pfedhn_beats_baselines_n50(results: Results) -> ClaimResult:
    """Table 1, the 50-client columns (CIFAR-10, CIFAR-100): pFedHN above every baseline
    (pFedHN-PC, its own variant, is not a baseline)."""
    return pairwise(pfedhn_beats_baselines_n50, results, "pfedhn_table1_*_n50", "pFedHN",
                    lambda k: not k.startswith("pFedHN"), lambda a, b: a > b, "pFedHN > best baseline",
                    strict=True, finding=finding("pfedhn_beats_baselines_n50", results))
