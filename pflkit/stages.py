"""One method of an experiment file, trained on a federation the caller chooses.

The runner trains every method of an experiment on the experiment's own federation. Some figures
need a method trained on part of it (pFedHN's 90 training and 10 novel clients, sec. 5.3; one
budget group of Table 2) or need the trained state itself (mix-and-match, Fig. 3), which
``results.json`` does not keep: `train_method` runs the same stage the runner would, on the given
federation, and returns its `StageResult`. The analyses of `pflkit.analysis` then work on what it
returns, without training anything themselves.

The runner itself trains a method on part of the federation when the experiment file says so
(`pflkit.experiments.MethodStage`: ``clients``, ``model``, ``start_from``): `method_setting` gives
the federation and the experiment that method sees.
"""
from __future__ import annotations

import dataclasses

from pflkit.algorithms import get_algorithm
from pflkit.algorithms import pfedhn
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, run_rounds


def client_subset(fed: Federation, ids) -> Federation:
    """The clients ``ids`` of ``fed`` as a federation of their own, renumbered 0..len(ids)-1 in that order
    (the recipe records ``subset``: the original ids). Same as `pflkit.analysis.pfedhn.subfederation`,
    which the analyses keep because they may not import this module."""
    ids = [int(i) for i in ids]
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= fed.num_clients:
        raise ValueError(f"ids must be distinct client ids in [0, {fed.num_clients}), got {ids[:10]}")
    clients = [dataclasses.replace(fed.clients[i], id=j) for j, i in enumerate(ids)]
    return Federation(fed.meta, fed.x, fed.y, clients, {**fed.recipe, "subset": ids})


def method_setting(exp, stage, fed: Federation):
    """(federation, experiment) that method ``stage`` trains in: its client group of ``fed`` (`client_subset`)
    and ``exp`` with its model options, or ``fed`` and ``exp`` themselves (the same objects) when it has none.

    pFedHN Table 2 (sec. 5.2, App. B): each baseline is trained on one budget group with that group's LeNet.
    """
    clients, options = getattr(stage, "clients", None), getattr(stage, "model", None) or {}
    if clients is not None:
        fed = client_subset(fed, clients.ids(fed.num_clients))
    if options:
        exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, options={**exp.model.options, **options}))
    return fed, exp


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
