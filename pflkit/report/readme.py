"""The README's result tables, generated from the compact results (``results/<preset>/<experiment>.json``).

A generated table in README.md sits between two markers that name the preset and the experiments::

    <!-- results cpu: pfedhn_table1_c10_n10, pfedhn_table1_c10_n50 -->
    (generated text)
    <!-- /results -->

The text is one row per method (and one per method measured on unseen clients too, ``X (unseen)``) and
one column per experiment; each cell is ``ours (paper)``, ours being
the mean over clients of each client's test accuracy (%) averaged over seeds (± the standard deviation over
seeds when there are several) or the method's status when it did not finish, the paper's number the
experiment file's ``[published]`` one. Under the table, per experiment: the data used, the seeds, the
declared deviations, FedL2P's learned beta where the run records it, and the command that made the result.
A second kind of block holds the claims of some papers (`pflkit.report.claims`), checked on every result of
the preset as in REPRODUCTION.md::

    <!-- claims cpu: fedl2p, pfedhn -->
    (generated text)
    <!-- /claims -->

`sync_readme` rewrites every block from the files; `stale_blocks` names the blocks whose text differs from
what the files give (the README sync test).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pflkit.io import atomic_write, read_json
from pflkit.report.compact import compact_path
from pflkit.report.divergence import mark_divergence
from pflkit.report.reproduction import (STALE, UNSEEN, catalog_stubs, claims_table, data_label, load_results,
                                        method_result, out_of_date)
from pflkit.report.timing import run_time

BLOCK = re.compile(r"<!-- results (?P<preset>[\w-]+): (?P<names>[^>]*?) -->\n(?P<body>.*?)<!-- /results -->",
                   re.DOTALL)
CLAIMS = re.compile(r"<!-- claims (?P<preset>[\w-]+): (?P<papers>[^>]*?) -->\n(?P<body>.*?)<!-- /claims -->",
                    re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One generated table of the README: its preset, its experiments and the text now between the markers."""

    preset: str
    names: tuple[str, ...]
    body: str


def _block(m: re.Match) -> Block:
    return Block(m["preset"], tuple(n.strip() for n in m["names"].split(",") if n.strip()), m["body"])


def blocks(text: str) -> list[Block]:
    """Every results block of a README text, in order."""
    return [_block(m) for m in BLOCK.finditer(text)]


def _ours(method: dict | None) -> str:
    if method is None:
        return "-"
    if method.get("status") != "ok" or method.get("acc_mean") is None:
        return method.get("status", "missing")
    text = f"{method['acc_mean']:.1f}"
    if len(method.get("per_seed") or []) > 1 and method.get("acc_std") is not None:
        text += f" ± {method['acc_std']:.1f}"
    return text


def cell(result: dict, label: str) -> str:
    """``ours (paper)``, ``ours`` without a published number, ``-`` for a method the experiment lacks."""
    method = method_result(result, label)
    paper = result.get("config", {}).get("published", {}).get(label)
    if method is None:
        return "-"
    return _ours(method) + ("" if paper is None else f" ({paper:g})")


def _labels(results: list[dict]) -> list[str]:
    """Every method of the results, then ``"X (unseen)"`` for each one measured on unseen clients too."""
    seen: dict[str, None] = {}
    for res in results:
        seen.update(dict.fromkeys(res.get("methods", {})))
    unseen = {f"{k}{UNSEEN}": None for res in results for k, m in res.get("methods", {}).items() if m.get("unseen")}
    return list(seen) + list(unseen)


def _note(res: dict) -> str:
    dev = ", ".join(f"`{d}`" for d in res.get("deviations", [])) or "none"
    seeds = res.get("config", {}).get("seeds", 1)
    took = run_time(res, decimals=0)
    took = f", {took} here" if took else ""
    betas = [f"{label} {a['beta_mean']:.2f}" for label, a in (res.get("analysis") or {}).items()
             if (a or {}).get("beta_mean") is not None]
    beta = f"; learned beta (mean over clients and BN layers): {', '.join(betas)}" if betas else ""
    old = f" {STALE}; rerun with" if out_of_date(res) else ""
    return (f"- `{res['experiment']}`: {data_label(res)}; seeds {seeds}; declared deviations: {dev}{took}{beta}.{old} "
            f"`{res.get('command', '')}`")


def render(results: list[dict]) -> str:
    """The text of one block: the method x experiment table, then a note per experiment."""
    head = "| method | " + " | ".join(f"`{r['experiment']}`" for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    lines += [f"| {label} | " + " | ".join(cell(r, label) for r in results) + " |" for label in _labels(results)]
    return "\n".join(lines + [""] + [_note(r) for r in results]) + "\n"


def _load(results_dir, preset: str, names) -> list[dict]:
    missing = [n for n in names if not compact_path(results_dir, preset, n).exists()]
    if missing:
        raise FileNotFoundError(f"README block names {', '.join(missing)} but {results_dir}/{preset}/ has no result "
                                f"for {'it' if len(missing) == 1 else 'them'}: run `pflkit reproduce --preset "
                                f"{preset} --only {','.join(missing)}` first")
    return [mark_divergence(read_json(compact_path(results_dir, preset, n))) for n in names]


def expected(block: Block, results_dir="results") -> str:
    """What the block's text must be, given the compact results."""
    return render(_load(results_dir, block.preset, block.names))


def _papers(m: re.Match) -> tuple[str, ...]:
    return tuple(p.strip() for p in m["papers"].split(",") if p.strip())


def _claims_rows(preset: str, results_dir, catalog) -> dict[str, dict]:
    """Every result of ``preset``, with the catalog's experiments that have none as stubs (counted not run)."""
    return {**catalog_stubs(preset, catalog), **load_results(results_dir).get(preset, {})}


def _claims_bodies(text: str, results_dir, catalog) -> list[tuple[re.Match, str]]:
    """Every claims block of ``text`` with the text the results give it: claim, verdict, the paper's number and
    ours, for each claim of the block's papers (each preset's results read once)."""
    rows: dict[str, dict] = {}
    out = []
    for m in CLAIMS.finditer(text):
        if m["preset"] not in rows:
            rows[m["preset"]] = _claims_rows(m["preset"], results_dir, catalog)
        out.append((m, claims_table(rows[m["preset"]], _papers(m), why=False)))
    return out


def stale_blocks(text: str, results_dir="results", catalog=None) -> list[str]:
    """``preset: names`` of every results block, ``claims preset: papers`` of every claims block, whose
    text differs from what the results give."""
    out = [f"{b.preset}: {', '.join(b.names)}" for b in blocks(text) if b.body != expected(b, results_dir)]
    return out + [f"claims {m['preset']}: {', '.join(_papers(m))}"
                  for m, body in _claims_bodies(text, results_dir, catalog) if m["body"] != body]


def sync_text(text: str, results_dir="results", catalog=None) -> str:
    """The README text with every block regenerated from the results."""
    def fill(m: re.Match) -> str:
        header = m.group(0)[: m.start("body") - m.start()]
        return header + expected(_block(m), results_dir) + "<!-- /results -->"

    text = BLOCK.sub(fill, text)
    bodies = iter(body for _, body in _claims_bodies(text, results_dir, catalog))

    def fill_claims(m: re.Match) -> str:
        header = m.group(0)[: m.start("body") - m.start()]
        return header + next(bodies) + "<!-- /claims -->"
    return CLAIMS.sub(fill_claims, text)


def sync_readme(readme="README.md", results_dir="results", catalog=None) -> list[str]:
    """Rewrite the README's results and claims blocks from ``results_dir``; returns the blocks that changed."""
    path = Path(readme)
    text = path.read_text()
    changed = stale_blocks(text, results_dir, catalog)
    if changed:
        new = sync_text(text, results_dir, catalog)
        atomic_write(path, lambda f: f.write(new.encode()))
    return changed
