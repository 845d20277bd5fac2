"""The notebooks' side of pflkit: the session a notebook opens (`session.setup`: preset, device, data, output
folders, committed results or training; its stand-in datasets, `standins`), finding and executing the notebooks
(`execute`), their Colab badge and install cell (`install`) and the notebooks committed with their outputs
(`outputs`)."""
