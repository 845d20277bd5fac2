"""The progress bar every long loop uses: a widget in a notebook kernel that has ipywidgets, text elsewhere.

``tqdm.auto`` picks the widget bar whenever it runs inside a kernel and, when ipywidgets is not
installed (a plain ``pip install pflkit[dev]``, a bare JupyterLab), warns on stderr at import time. A
notebook run that only redraws committed results must leave no stderr, so the widget bar is chosen only
when ipywidgets can be imported; otherwise the text bar, which works everywhere, is used silently.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:  # no widgets: the text bar, without tqdm.auto's "IProgress not found" warning
    from tqdm.std import tqdm

__all__ = ["tqdm"]
