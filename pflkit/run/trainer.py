"""Who trains a run's stages, and what it can do: the `Trainer` a run is given.

Where a run's clients live is its transport; how a round's client updates run in this process is its
engine (`pflkit.fl.engines.ENGINES`). The default `Trainer` trains every stage with pflkit's round loop in
this process (`train_locally`); Flower's (`pflkit.flower.serve.flower_trainer`) trains them on Flower's
nodes. `run_experiment` asks the trainer, before any work, whether it can do what the experiment needs
(`Trainer.check`), instead of asking which trainer it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pflkit.algorithms import get_algorithm
from pflkit.config import ConfigError
from pflkit.fl.engines import check_engine
from pflkit.fl.loop import StageResult, run_rounds
from pflkit.run.experiment_config import ExperimentConfig


def train_locally(algo, cfg, fed, model, env, *, checkpoint=None, resume=False, desc=None, label=None) -> StageResult:
    """One stage through pflkit's round loop in this process (`run_rounds`, its engine ``env.engine``).

    ``label`` (the stage's name) belongs to the trainers' common signature: Flower's sends it to the nodes
    to name the stage's client states; here the client states stay in memory, so it is not needed."""
    return run_rounds(algo, cfg, fed, model, env, checkpoint=checkpoint, resume=resume, desc=desc)


@dataclass(frozen=True)
class Trainer:
    """Trains one stage of a run (``train``) and says what it supports.

    Attributes:
        train: ``train(algo, cfg, fed, model, env, *, checkpoint, resume, desc, label) -> StageResult``.
        transport: whose round loop runs the stages, results.json's ``engine`` (``"pflkit"``, ``"flower"``).
        engine: how this process runs a round's client updates (`pflkit.fl.engines.ENGINES`); the only
            engine of the stages it runs itself (a separate pretraining stage's test pass) when the
            clients live elsewhere.
        in_process: the clients live in this process, so each stage records the engine it used.
        given_data: takes a dataset or federation object (`run_experiment(dataset=..., federation=...)`).
        pretrain_federation: builds a pretraining stage's own federation (``[pretrain.data]``).
        fits_unseen: fits unseen clients after training (pFedHN sec. 5.3, `Algorithm.fit_unseen`).
        method_settings: trains a method on a client group, with its own model or from another method.
    """

    train: Callable[..., StageResult] = train_locally
    transport: str = "pflkit"
    engine: str = "auto"
    in_process: bool = True
    given_data: bool = True
    pretrain_federation: bool = True
    fits_unseen: bool = True
    method_settings: bool = True

    def check(self, cfg: ExperimentConfig, given: bool) -> None:
        """One-line `ConfigError`s, before any work, for what ``cfg`` needs and this trainer cannot do
        (``given``: a dataset or federation object was handed to the run)."""
        check_engine(self.engine)
        name = self.transport
        if given and not self.given_data:
            raise ConfigError(f"run_experiment: a dataset or federation object works with the pflkit engine only; "
                              f"the {name} engine's nodes build their clients from [data] themselves")
        if not self.pretrain_federation and cfg.pretrain is not None and cfg.pretrain.data is not None:
            raise ConfigError(f"pretrain.data: the {name} engine cannot build the pretraining stage's own "
                              "federation yet; run this experiment with the pflkit engine")
        unseen_fit = [m.label for m in cfg.methods if get_algorithm(m.algorithm).fit_unseen is not None]
        if not self.fits_unseen and cfg.data.unseen_clients and unseen_fit:
            raise ConfigError(f"data.unseen_clients={cfg.data.unseen_clients}: the {name} engine cannot fit "
                              f"{unseen_fit[0]}'s unseen clients yet; run this experiment with the pflkit engine")
        own = [m.label for m in cfg.methods if getattr(m, "extra_dict", dict)()]
        if not self.method_settings and own:
            raise ConfigError(f"methods.{own[0]}: the {name} engine cannot train a method on a client group, "
                              "with its own model or from another method yet; run it with the pflkit engine")
