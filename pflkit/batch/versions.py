"""What a batch result was made from: the version of the run code and the digest of the configuration.

The code version is a digest of the library code a run executes, ignoring comments and docstrings
(`code_version`), not the git commit: committing the results must not make them stale. The parts of the
package a run never executes (`NOT_RUN_CODE`) are left out of it.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import pflkit
from pflkit.report.compact import config_digest

# parts of the package that a run does not execute (tables, figures, the CLI, the notebooks, the Flower engine, and
# this batch layer: the batch, its stage reuse, the behavioural fingerprints, the hypergradient check)
NOT_RUN_CODE = ("report", "analysis", "flower", "catalog", "batch", "notebooks", "cli.py")


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def code_version(package: Path | None = None) -> dict:
    """``{"pflkit": version, "source": digest}``: the digest covers the syntax tree of every module a
    run executes (`NOT_RUN_CODE` excluded), so comments and docstrings do not count, code does.

    For the installed package it is computed once per process: the code a process runs is the code
    it imported, whatever is edited on disk meanwhile.
    """
    if package is None:
        return dict(_own_code_version())
    return _digest(Path(package))


@functools.lru_cache(maxsize=1)
def _own_code_version() -> tuple:
    return tuple(_digest(Path(pflkit.__file__).resolve().parent).items())


def _digest(root: Path) -> dict:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_RUN_CODE or "__pycache__" in rel.parts:
            continue
        text = path.read_text()
        try:
            body = ast.dump(_strip_docstrings(ast.parse(text)))
        except SyntaxError:  # a file mid-edit: its text then
            body = text
        h.update(f"{rel.as_posix()}\0{body}\0".encode())
    return {"pflkit": pflkit.__version__, "source": h.hexdigest()[:16]}


def config_hash(cfg) -> str:
    """Digest of the resolved configuration less the settings that do not change a run's numbers
    (`pflkit.report.compact.config_digest`; seeds and sizes count)."""
    return config_digest(cfg.to_dict())
