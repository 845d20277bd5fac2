"""One experiment run: its experiment file resolved (`experiments`), its data checked, its pretraining
(`pretraining`), every method on every seed (`stages`, `runner`), the run folder it resumes from and the
``results.json`` it writes. ``pflkit.run.runner.run_experiment`` is the entry point."""
