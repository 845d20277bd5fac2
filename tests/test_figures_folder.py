"""figures/ holds only what something in the repository writes there.

A figure no notebook, batch step or documented benchmark command makes any more cannot be rebuilt by
`pflkit reproduce`, so it goes stale beside results that change (it then shows numbers no committed
result has). Writers: each notebook's ``session.figure(...)`` names (into ``figures/<its folder>/``),
the cross-paper matrix (`pflkit.report.matrix.write_matrix`, ``figures/matrix/``), and benchmark
commands the README gives with ``--plot figures/...``.
"""
import fnmatch
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIGURES = REPO / "figures"
_NAME = re.compile(r"""session\.figure\(f?["']([^"']+)["']\)""")
_PLOT = re.compile(r"python benchmarks/\w+\.py[^`\n]*--plot (figures/\S+?)[`\s]")


def _glob(fstring: str) -> str:
    return re.sub(r"\{[^}]*\}", "*", fstring)


def writers() -> list[str]:
    """Glob patterns, relative to the repository, of every figure a writer makes."""
    out = []
    for nb in sorted((REPO / "notebooks").glob("*/*.py")):
        out += [f"figures/{nb.parent.name}/{_glob(n)}" for n in _NAME.findall(nb.read_text())]
    matrix = (REPO / "pflkit" / "report" / "matrix.py").read_text()
    out += [f"figures/matrix/{_glob(n)}" for n in re.findall(r'folder / f"([^"]+)"', matrix)]
    out += _PLOT.findall((REPO / "README.md").read_text())
    return out


def test_writers_are_found():
    # the scan itself: a notebook's figure, the matrix's two files, the README's benchmark figure
    found = writers()
    assert "figures/tutorials/fedavg_rounds.png" in found
    assert {"figures/matrix/matrix_*.png", "figures/matrix/matrix_*.md"} <= set(found)
    assert "figures/pfedhn/memory_scaling.png" in found
    assert "figures/fedl2p/*_methods.png" in found  # session.figure(f"{name}_methods.png")


def test_every_figure_has_a_writer():
    patterns = writers()
    orphans = [p.relative_to(REPO).as_posix() for p in sorted(FIGURES.rglob("*"))
               if p.is_file() and p.name != "README.md"
               and not any(fnmatch.fnmatchcase(p.relative_to(REPO).as_posix(), g) for g in patterns)]
    assert not orphans, f"figures no notebook, batch step or README benchmark command writes: {orphans}"
