"""The notebooks' side of pflkit: the session a notebook opens (`session.setup`: preset, device, data,
output folders, committed results or training) and the notebooks committed with their outputs (`outputs`)."""
