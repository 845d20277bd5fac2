"""Committed notebooks carry the outputs that the committed results produce (`pflkit.notebooks.outputs`).

Each notebook is executed again in results mode and compared with the committed file: text outputs exactly,
images by presence and pixel size. No output may be an error, a warning, a memory address or an absolute path.
A notebook without a results mode yet (no ``source`` parameter) carries no outputs; one with it must carry them.
"""
import json
from pathlib import Path

import pytest

from pflkit.notebooks.outputs import compare, dumps, execute_results_mode, has_results_mode, problems, with_outputs
from pflkit.notebooks.execute import find_notebooks
from tests.test_notebooks import with_data

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = find_notebooks()
# notebooks not yet rewritten for results mode (no `source` parameter): they carry no outputs
PENDING = {nb for nb in NOTEBOOKS if not has_results_mode(nb)}


def _key(nb: Path) -> str:
    return nb.relative_to(nb.parents[1]).with_suffix("").as_posix()


COMMITTED = [nb for nb in NOTEBOOKS if nb not in PENDING]


def _has_outputs(nb: dict) -> bool:
    return any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_key)
def test_a_notebook_is_committed_with_outputs_unless_pending(nb):
    has = _has_outputs(json.loads(nb.read_text()))
    assert has == (nb not in PENDING), ("run `pflkit notebooks --commit`" if not has else
                                         "a notebook without results mode must not carry outputs")


@pytest.mark.parametrize("nb", with_data(COMMITTED))
def test_committed_outputs_are_what_the_committed_results_produce(nb):
    committed = json.loads(nb.read_text())
    fresh = with_outputs(committed, execute_results_mode(nb))
    assert problems(fresh) == []
    assert compare(committed, fresh) == [], "run `pflkit notebooks --commit` and commit the notebook"
    assert dumps(committed) == nb.read_text(), "not in the committed serialization: run `pflkit notebooks --commit`"


def _nb(*outputs) -> dict:
    return {"cells": [{"cell_type": "code", "source": "x", "metadata": {}, "outputs": list(outputs),
                       "execution_count": 1}]}


def _png(width: int, height: int) -> str:
    import base64
    import struct

    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + struct.pack(">II", width, height)).decode()


def test_the_comparison_sees_text_and_image_size_but_not_image_bytes():
    a = _nb({"output_type": "display_data", "data": {"image/png": _png(10, 20), "text/plain": "<Figure>"}})
    same_size = _nb({"output_type": "display_data", "data": {"image/png": _png(10, 20) + "AAAA",
                                                             "text/plain": "<Figure>"}})
    other_size = _nb({"output_type": "display_data", "data": {"image/png": _png(11, 20), "text/plain": "<Figure>"}})
    other_text = _nb({"output_type": "stream", "name": "stdout", "text": "82.3\n"})
    assert compare(a, same_size) == []
    assert compare(a, other_size) and compare(a, other_text)


def test_problems_finds_errors_warnings_addresses_and_absolute_paths():
    assert problems(_nb({"output_type": "stream", "name": "stdout", "text": "FedL2P 94.44\n"})) == []
    bad = [{"output_type": "error", "ename": "KeyError", "evalue": "'x'", "traceback": []},
           {"output_type": "stream", "name": "stderr", "text": "IProgress not found\n"},
           {"output_type": "execute_result", "data": {"text/plain": "<Axes at 0x7f3b15648290>"}},
           {"output_type": "stream", "name": "stdout", "text": "read from /tmp/pflkit-nb-1/demo\n"}]
    for o in bad:
        assert problems(_nb(o)), o


def test_with_outputs_keeps_the_source_drops_papermills_cell_and_numbers_cells():
    source = {"cells": [{"cell_type": "markdown", "source": "# t", "metadata": {}},
                        {"cell_type": "code", "source": "print(1)", "metadata": {"tags": ["parameters"]},
                         "outputs": [], "execution_count": None}], "metadata": {"kernelspec": {}}}
    ran = {**source["cells"][1], "metadata": {"papermill": {"duration": 1}}, "execution_count": 7,
           "outputs": [{"output_type": "stream", "name": "stdout", "text": "1\n"}]}
    injected = {"cell_type": "code", "source": "x = 2", "metadata": {"tags": ["injected-parameters"]}, "outputs": []}
    executed = {"cells": [source["cells"][0], injected, ran], "metadata": {"papermill": {"start_time": "now"}}}
    out = with_outputs(source, executed)
    assert out["metadata"] == source["metadata"] and out["cells"][1]["metadata"] == {"tags": ["parameters"]}
    assert out["cells"][1]["execution_count"] == 1 and out["cells"][1]["outputs"][0]["text"] == "1\n"
