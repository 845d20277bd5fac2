"""Imports run one way: data / models -> fl, meta -> algorithms -> runner -> report / analysis -> notebooks.

Every import of a pflkit module anywhere in a file is read from the source with `ast`: absolute and
relative (``from . import x``, ``from ..fl import y``, resolved against the importing module's package),
at module level and inside functions, so neither a lazy nor a relative import can hide a crossed wire.
Two checks read that graph: no import against ``FORBIDDEN``'s direction, and no circle at all (a
function-level circle is still a circle: the two modules cannot be understood, moved or tested apart).
``PENDING`` lists crossings still to be removed; the test fails on any crossing not listed and on a
listed one that is gone (then delete its line).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pflkit

PACKAGE = Path(pflkit.__file__).parent
TRAINING = ("pflkit.fl.loop", "pflkit.run", "pflkit.algorithms", "pflkit.flower", "pflkit.batch")
ABOVE_ALGORITHMS = ("pflkit.run", "pflkit.batch", "pflkit.report", "pflkit.analysis", "pflkit.flower",
                    "pflkit.notebooks", "pflkit.cli")
# what reads saved results sits below the notebook session and the command line that call it
BELOW_NOTEBOOKS = (*TRAINING, "pflkit.notebooks", "pflkit.cli")
LEAVES = ("pflkit.config", "pflkit.io")

# package (or module) prefix -> prefixes it must not import
FORBIDDEN = {
    # the leaves every layer may use: config validation, files and the progress bar, errors
    **{leaf: ("pflkit.data", "pflkit.models", "pflkit.kernels", "pflkit.fl", "pflkit.meta", "pflkit.algorithms",
              *ABOVE_ALGORITHMS) for leaf in LEAVES},
    "pflkit.errors": ("pflkit.data", "pflkit.models", "pflkit.kernels", "pflkit.fl", "pflkit.meta", "pflkit.algorithms",
                      "pflkit.config", "pflkit.io", *ABOVE_ALGORITHMS),
    "pflkit.data": ("pflkit.fl", "pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.models": ("pflkit.fl", "pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.kernels": ("pflkit.fl", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.fl": ("pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    # generic meta-learning math: no federation, no client (FedL2P's client side is pflkit.algorithms.fedl2p_client)
    "pflkit.meta": ("pflkit.fl", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.algorithms": ABOVE_ALGORITHMS,
    # a run knows nothing of the batch over runs, the reports, the notebooks, the command line or Flower (whose
    # trainer, pflkit.flower.serve.flower_trainer, is handed to the run)
    "pflkit.run": ("pflkit.batch", "pflkit.report", "pflkit.analysis", "pflkit.notebooks", "pflkit.cli",
                   "pflkit.flower"),
    "pflkit.batch": ("pflkit.notebooks.outputs", "pflkit.cli"),
    "pflkit.analysis": BELOW_NOTEBOOKS,
    "pflkit.report": BELOW_NOTEBOOKS,
}
# package prefix -> modules it may import although ``FORBIDDEN`` bans their package: the report and the analyses
# read experiment files (the catalog's titles, presets and published numbers), not runs
ALLOWED = {"pflkit.report": ("pflkit.run.experiments",), "pflkit.analysis": ("pflkit.run.experiments",)}

PENDING: set[tuple[str, str]] = set()


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_statements(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """Every import statement of the file, anywhere in it, as (absolute module, names taken from it).

    ``import a.b`` is ``("a.b", [])``; ``from a import b, c`` is ``("a", ["b", "c"])``; a relative
    ``from ..x import y`` in module ``p.q.m`` is ``("p.x", ["y"])`` (in ``p/q/__init__.py`` it is ``p.x`` too:
    a package's own ``__init__`` counts from the package itself)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{path}: relative import beyond the top package (level {node.level})")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            out.append((base, [a.name for a in node.names]))
    return out


def imported(path: Path, module: str | None = None, top: str = "pflkit") -> set[str]:
    """Every ``top`` module or name an import statement of the file names (``from a import b``: a and a.b)."""
    module = module if module is not None else f"{top}.{path.stem}"
    out = set()
    for base, names in import_statements(path, module):
        if base == top or base.startswith(top + "."):
            out |= {base} | {f"{base}.{n}" for n in names}
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, module-level and function-level alike.

    ``from a import b`` is an edge to ``a.b`` where that is a module of the package, else to ``a``."""
    files = module_files(root)
    top = root.name
    graph = {}
    for mod, path in files.items():
        edges = set()
        for base, names in import_statements(path, mod):
            if base != top and not base.startswith(top + "."):
                continue
            if not names:
                edges.add(base)
            edges |= {f"{base}.{n}" if f"{base}.{n}" in files else base for n in names}
        graph[mod] = {e for e in edges if e in files and e != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` for each group of modules that import each other (directly or round
    about: a strongly connected component of more than one module), found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(root: str) -> None:  # iterative: a deep chain of imports must not hit the recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.add(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circle_in(graph, g) for g in groups)


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle through the group's first module, staying inside the group (breadth first)."""
    start = min(group)
    previous = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in the group {sorted(group)}")


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def crossings(root: Path = PACKAGE, forbidden: dict = FORBIDDEN, allowed: dict = ALLOWED) -> set[tuple[str, str]]:
    found = set()
    for mod, path in module_files(root).items():
        for src, banned in forbidden.items():
            if not under(mod, src):
                continue
            for name in imported(path, mod, root.name):
                if any(under(name, a) for a in allowed.get(src, ())):
                    continue
                for b in banned:
                    if under(name, b) and not under(name, src):
                        found.add((mod, b))
    return found


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_imported_reads_lazy_and_relative_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from pflkit.run.runner import slug\n    import pflkit.fl.loop\n"
                 "from . import notebooks\nfrom ..fl.train import train_locally\n")
    assert imported(f, "pflkit.report.m") == {
        "pflkit.run.runner", "pflkit.run.runner.slug", "pflkit.fl.loop", "pflkit.report", "pflkit.report.notebooks",
        "pflkit.fl.train", "pflkit.fl.train.train_locally"}


def test_a_package_init_counts_relative_imports_from_itself(tmp_path):
    f = write_package(tmp_path, {"pkg/sub/__init__.py": "from .a import x\nfrom .. import b\n"}) / "pkg/sub/__init__.py"
    assert imported(f, "pkg.sub", "pkg") == {"pkg.sub.a", "pkg.sub.a.x", "pkg", "pkg.b"}


def test_checker_finds_a_forbidden_relative_import(tmp_path):
    root = write_package(tmp_path, {"pkg/__init__.py": "", "pkg/data/__init__.py": "", "pkg/fl/__init__.py": "",
                                    "pkg/fl/loop.py": "", "pkg/data/ok.py": "from . import base\n",
                                    "pkg/data/base.py": "def f():\n    from ..fl import loop\n"}) / "pkg"
    assert crossings(root, {"pkg.data": ("pkg.fl",)}) == {("pkg.data.base", "pkg.fl")}
    assert crossings(root, {"pkg.fl": ("pkg.data",)}) == set()


def test_an_allowed_module_of_a_forbidden_package_passes_and_its_siblings_do_not(tmp_path):
    root = write_package(tmp_path, {"pkg/__init__.py": "", "pkg/run/__init__.py": "", "pkg/run/experiments.py": "",
                                    "pkg/run/runner.py": "", "pkg/report/__init__.py": "",
                                    "pkg/report/a.py": "from pkg.run.experiments import resolve\n",
                                    "pkg/report/b.py": "def f():\n    from ..run.runner import run\n"}) / "pkg"
    banned, allowed = {"pkg.report": ("pkg.run",)}, {"pkg.report": ("pkg.run.experiments",)}
    assert crossings(root, banned, {}) == {("pkg.report.a", "pkg.run"), ("pkg.report.b", "pkg.run")}
    assert crossings(root, banned, allowed) == {("pkg.report.b", "pkg.run")}


def test_checker_finds_a_lazy_circle_and_names_it(tmp_path):
    root = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from .b import g\n    return g\n",
        "pkg/b.py": "def g():\n    from pkg import a\n    return a\n",
        "pkg/c.py": "from .a import f\n"}) / "pkg"
    assert import_graph(root) == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b", "pkg.a"]]
    (root / "b.py").write_text("def g():\n    return 1\n")  # the circle broken: nothing to report
    assert cycles(import_graph(root)) == []


def test_cycles_names_the_shortest_circle_of_a_longer_group():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"b"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_imports_run_one_way():
    found = crossings()
    assert found - PENDING == set(), f"imports against the direction: {sorted(found - PENDING)}"
    assert PENDING - found == set(), f"fixed, remove from PENDING: {sorted(PENDING - found)}"


def test_no_import_circle():
    """No two pflkit modules import each other, directly or round about, at module level or inside
    a function."""
    found = cycles(import_graph())
    assert found == [], "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_every_module_imports_in_a_fresh_interpreter():
    """Every pflkit module imports in a fresh interpreter (a circle of module-level imports would fail
    whichever of its modules is imported first); a missing optional dependency (Flower, Triton) is no error."""
    import subprocess
    import sys

    names = sorted(module_files(PACKAGE))
    script = ("import importlib, sys\n"
              "for n in sys.argv[1:]:\n"
              "    try:\n"
              "        importlib.import_module(n)\n"
              "    except ModuleNotFoundError as e:\n"
              "        if (e.name or '').startswith('pflkit'):\n"
              "            print(n, repr(e))\n"
              "    except ImportError as e:\n"
              "        print(n, repr(e))\n")
    out = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr[-2000:]
