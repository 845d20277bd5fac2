"""The papers pflkit reproduces, in the report's order: one line each, naming the paper's package.

A paper's package (``pflkit.report.<paper>``) says who it is -- ``TITLE`` (its heading in REPRODUCTION.md),
``STAND_INS`` (dataset used -> the paper's dataset its published numbers are on), ``KEEP_STATES`` (the runs whose
stages keep their trained states for its notebooks) and ``CLAIMS`` (its claim functions, in order) -- and holds
its claims (``claims.py``) and its figures and tables. Adding a paper is its package, its experiment files
(``pflkit/catalog/<paper>/``, whose ``[experiment] paper`` is its key here) and one line in `PAPERS`.
Everything else reads the unions below.
"""
from __future__ import annotations

from pflkit.report import fedl2p, fedselect, pfedhn, pfedvem
from pflkit.report.claims import ClaimResult, Results

PAPERS = {  # paper key -> its package
    "fedl2p": fedl2p,
    "pfedhn": pfedhn,
    "fedselect": fedselect,
    "pfedvem": pfedvem,
}
# sections of the report that are no paper's, after the papers
OTHER_SECTIONS = {
    "tutorial": "Tutorials",
    "matrix": "Cross-paper matrix: every method on every offline heterogeneity (pflkit's own, no paper)",
}
TITLES = {**{key: paper.TITLE for key, paper in PAPERS.items()}, **OTHER_SECTIONS}  # key -> heading, in order
# (paper, dataset used) -> the paper's dataset whose published numbers the row is compared with; an experiment
# file may say it itself: [experiment] stands_in_for = "..."
STAND_INS = {(key, data): theirs for key, paper in PAPERS.items() for data, theirs in paper.STAND_INS.items()}
# runs (experiment-name globs) whose stages keep their final states in the batch's work folder, so that a
# notebook reads them instead of training the same model again (`pflkit.batch.work_folder`)
KEEP_STATES = tuple(pattern for paper in PAPERS.values() for pattern in paper.KEEP_STATES)
CLAIMS = tuple(fn for paper in PAPERS.values() for fn in paper.CLAIMS)  # every paper's, in the report's order


def check_all(results: Results) -> list[ClaimResult]:
    """Every claim of `CLAIMS` over one preset's compact results."""
    return [fn(results) for fn in CLAIMS]


def claims_of(results: Results, paper: str) -> list[ClaimResult]:
    """The claims of ``paper`` (a key of `PAPERS`) checked on ``results`` (``{experiment: compact result or
    results.json with its analysis}``): for each, ``verdict`` (holds / fails / inconclusive / budget-limited /
    not run), ``interval`` (the 95% interval it was read from, as text) and ``reason`` (why, with the finding for
    a claim that does not hold); none for a key that is no paper's (a tutorial)."""
    return [fn(results) for fn in (PAPERS[paper].CLAIMS if paper in PAPERS else ())]
