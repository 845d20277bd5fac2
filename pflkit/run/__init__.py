"""One experiment run. Its experiment file resolved (`experiments`) into frozen settings (`experiment_config`);
its environment (`environment`), data checks (`checks`) and run folder (`folder`); its pretraining stage
(`pretraining`) and every method's stage (`stages`), trained by a `trainer.Trainer`; every seed (`runner`)
aggregated into ``results.json`` (`results`). ``pflkit.run.runner.run_experiment`` is the entry point."""
