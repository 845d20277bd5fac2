"""One method of an experiment file, trained on a federation the caller chooses.

The runner trains every method of an experiment on the experiment's own federation. Some figures
need a method trained on part of it (pFedHN's 90 training and 10 novel clients, sec. 5.3; one
budget group of Table 2) or need the trained state itself (mix-and-match, Fig. 3), which
``results.json`` does not keep: `train_method` runs the same stage the runner would, on the given
federation, and returns its `StageResult`. The analyses of `pflkit.analysis` then work on what it
returns, without training anything themselves.
"""
from __future__ import annotations

import dataclasses

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import pfedhn
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, run_rounds


def method_config(exp, label: str, **changes):
    """(algorithm, config) of method ``label`` of a resolved experiment (its pretraining stage included),
    with the given config fields replaced."""
    stages = {m.label: m for m in exp.methods}
    if exp.pretrain is not None:
        stages.setdefault(exp.pretrain.label, exp.pretrain)
    if label not in stages:
        raise ValueError(f"experiment {exp.name!r} has no method {label!r}; methods: {list(stages)}")
    stage = stages[label]
    return get_algorithm(stage.algorithm), dataclasses.replace(stage.config, **changes)


def train_method(exp, label: str, fed: Federation, env, *, model=None, desc: str | None = None,
                 **changes) -> StageResult:
    """Train and test method ``label`` of experiment ``exp`` on ``fed`` (a fresh model from ``env``
    unless ``model`` is given); returns the `StageResult` with its final states."""
    algo, cfg = method_config(exp, label, **changes)
    if model is None:
        env.seed_torch("init")
        model = env.model_fn().to(env.device)
    return run_rounds(algo, cfg, fed, model, env, desc=desc)


def fit_novel_clients(trained: StageResult, novel: Federation, cfg, env, *, rounds: int | None = None,
                      init: str = "mean") -> StageResult:
    """pFedHN sec. 5.3: phi frozen, each novel client's embedding learned (`pfedhn.fit_novel_clients`).

    ``cfg.novel_fit`` picks fitting to convergence (the default) or a round budget; ``rounds`` (given)
    selects the budget with that many rounds.
    """
    if rounds is not None:
        cfg = dataclasses.replace(cfg, novel_fit="rounds", novel_rounds=rounds)
    return pfedhn.fit_novel_clients(trained.state, novel, cfg, env, init=init)
