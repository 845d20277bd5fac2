"""Imports run one way: data / models -> fl, meta -> algorithms -> runner -> report / analysis.

Every ``import`` of a pflkit module anywhere in a file (function-level imports included) is read
from the source with `ast`, so a lazy import cannot hide a crossed wire. ``PENDING`` lists the
crossings still to be removed (issue "one loop and a house that reads top to bottom"); the test
fails on any crossing not listed and on a listed one that is gone (then delete its line).
"""
import ast
from pathlib import Path

import pflkit

PACKAGE = Path(pflkit.__file__).parent
TRAINING = ("pflkit.fl.loop", "pflkit.runner", "pflkit.algorithms", "pflkit.flower", "pflkit.reproduce",
            "pflkit.pretraining", "pflkit.stages")
ABOVE_ALGORITHMS = ("pflkit.experiments", "pflkit.runner", "pflkit.report", "pflkit.analysis", "pflkit.flower",
                    "pflkit.notebooks", "pflkit.reproduce", "pflkit.reuse", "pflkit.cli", "pflkit.pretraining", "pflkit.stages",
                    "pflkit.neumann_check")

# package (or module) prefix -> prefixes it must not import
FORBIDDEN = {
    # a leaf every layer may use: the progress bar
    "pflkit.progress": ("pflkit.errors", "pflkit.data", "pflkit.models", "pflkit.kernels", "pflkit.fl", "pflkit.meta",
                        "pflkit.algorithms", "pflkit.config", "pflkit.io", *ABOVE_ALGORITHMS),
    "pflkit.errors": ("pflkit.data", "pflkit.models", "pflkit.kernels", "pflkit.fl", "pflkit.meta", "pflkit.algorithms",
                      "pflkit.config", "pflkit.io", *ABOVE_ALGORITHMS),
    "pflkit.data": ("pflkit.fl", "pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.models": ("pflkit.fl", "pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.fl": ("pflkit.meta", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    # generic meta-learning math: no federation, no client (FedL2P's client side is pflkit.algorithms.fedl2p_client)
    "pflkit.meta": ("pflkit.fl", "pflkit.algorithms", *ABOVE_ALGORITHMS),
    "pflkit.algorithms": ABOVE_ALGORITHMS,
    "pflkit.analysis": TRAINING,
    "pflkit.report": TRAINING,
}

PENDING: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every pflkit module named by an import statement of the file (``from a import b``: a and a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pflkit")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pflkit"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def crossings() -> set[tuple[str, str]]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        mod = module_name(path)
        for src, banned in FORBIDDEN.items():
            if not under(mod, src):
                continue
            for name in imported(path):
                for b in banned:
                    if under(name, b) and not under(name, src):
                        found.add((mod, b))
    return found


def test_imported_reads_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from pflkit.runner import slug\n    import pflkit.fl.loop\n")
    assert imported(f) == {"pflkit.runner", "pflkit.runner.slug", "pflkit.fl.loop"}


def test_imports_run_one_way():
    found = crossings()
    assert found - PENDING == set(), f"imports against the direction: {sorted(found - PENDING)}"
    assert PENDING - found == set(), f"fixed, remove from PENDING: {sorted(PENDING - found)}"


def test_no_module_level_import_cycle():
    """Every pflkit module imports in a fresh interpreter. A cycle of module-level imports
    (``from X import name`` both ways) fails whichever of its modules is imported first, so one
    process importing them all finds it; a missing optional dependency (Flower, Triton) is not a cycle."""
    import subprocess
    import sys

    root = Path(pflkit.__file__).parent
    names = sorted(".".join(("pflkit", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
                   for p in root.rglob("*.py"))
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
