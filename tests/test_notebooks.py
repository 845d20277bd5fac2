"""Every notebook executes at the smoke preset; each has its parameters cell and matches its .py twin."""
import json
import re

import pytest

from pflkit.notebooks import find_notebooks, run_notebooks

NOTEBOOKS = find_notebooks()


def _ids():
    return [str(p.relative_to(p.parents[1])) for p in NOTEBOOKS]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_ids())
def test_notebook_structure(nb):
    cells = json.loads(nb.read_text())["cells"]
    tags = [c.get("metadata", {}).get("tags", []) for c in cells]
    assert sum("parameters" in t for t in tags) == 1, "exactly one cell tagged 'parameters'"
    src = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert not re.search(r"^\s*class \w+", src, re.MULTILINE), "notebooks import pflkit; they define no classes"
    assert "colab.research.google.com" in "".join("".join(c["source"]) for c in cells)
    twin = nb.with_suffix(".py")
    if twin.exists():
        import jupytext

        code = [c["source"] for c in jupytext.read(twin).cells if c["cell_type"] == "code"]
        assert code == ["".join(c["source"]) for c in cells if c["cell_type"] == "code"], f"{twin} out of sync"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_ids())
def test_notebook_runs_at_smoke(nb, tmp_path):
    folder = nb.parent.name
    done = run_notebooks("smoke", folder, tmp_path, only_names=[nb.name])
    assert done and done[0].exists()
