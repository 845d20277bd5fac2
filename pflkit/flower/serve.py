"""A whole pflkit experiment driven from a Flower ServerApp.

`serve(grid, settings)` is what the ServerApp's ``main`` does (`build_server_app` makes that ServerApp): resolve the experiment
from the settings (run config), map nodes to clients once, then run it with
`pflkit.run.runner.run_experiment`, whose trainer (`flower_trainer`) trains each stage with a
`PflkitStrategy` as the round loop's transport instead of this process's clients. The files written are those of a pflkit run: one JSON per
stage, the pretrained weights, ``federation.npz`` and ``results.json``. One Flower run
serves every stage, so Ray starts once per experiment.

Each stage runs through pflkit's own round loop (`pflkit.fl.loop.run_rounds`) with the
strategy as its transport, so a stopped Flower run resumes like a local one (``resume``):
finished stages are skipped and the unfinished one continues from its last checkpoint, the
clients reading their states as of that round from their state folder (node config
``state-dir``; in a simulation the run's ``client-state-dir``, by default ``out/client-states``).
Not available on Flower: reports that read client state (they live on the clients).
"""
from __future__ import annotations

import logging
from pathlib import Path

from flwr.serverapp import Grid, ServerApp

from pflkit.flower.runtime import experiment_from_settings, settings_for
from pflkit.flower.nodes import NodeMap
from pflkit.flower.server_app import PflkitStrategy
from pflkit.run.runner import run_experiment
from pflkit.run.trainer import Trainer

log = logging.getLogger(__name__)


def flower_trainer(train) -> Trainer:
    """The `Trainer` whose stages ``train`` on Flower's nodes (`serve` builds ``train`` for its grid).

    The clients live on the nodes, which build them from ``[data]``: no dataset or federation object, no
    pretraining federation of its own, no fit of unseen clients, no method on a client group yet. The
    stages this process runs itself (a separate pretraining stage's test pass) run sequentially."""
    return Trainer(train=train, transport="flower", engine="sequential", in_process=False, given_data=False,
                   pretrain_federation=False, fits_unseen=False, method_settings=False)


def _setting(settings, key, default, typ):
    value = settings.get(key, default)
    return typ(value) if value not in (None, "") else default


def serve(grid: Grid, settings) -> dict:
    """Run the experiment named by ``settings`` on the nodes behind ``grid``; returns (and writes) the results.

    Settings (Flower run config keys): ``experiment-json`` or ``experiment`` + ``preset`` +
    ``overrides``; ``data-root``; ``out`` (folder for results, and ``flower-failures.log``: the
    full text of every client failure); ``round-timeout`` (s, 0: wait for every client);
    ``node-wait`` (s to wait for a node of every partition to connect and answer, default 120);
    ``progress``; ``resume`` (continue the run in ``out``); ``client-state-dir`` (where the clients also
    write their states, for resuming; "" : memory only).
    """
    cfg = experiment_from_settings(settings)
    out = Path(_setting(settings, "out", f"runs/{cfg.name}-{cfg.preset}-flower", str))
    data_root = _setting(settings, "data-root", None, str)
    timeout = _setting(settings, "round-timeout", 0.0, float) or None
    progress = bool(_setting(settings, "progress", False, bool))
    nodes = NodeMap(cfg.data.num_clients)
    nodes.refresh(grid, timeout, wait=_setting(settings, "node-wait", 120.0, float))
    header = {**settings_for(cfg, data_root), "client-state-dir": _setting(settings, "client-state-dir", "", str)}

    def train_on_flower(algo, stage_cfg, fed, model, env, *, checkpoint=None, resume=False, desc=None, label=None):
        strategy = PflkitStrategy(algo, stage_cfg, fed, env, nodes, {**header, "seed": env.seed, "stage": label},
                                  timeout=timeout, desc=None if desc is None else f"{desc}, Flower", log_dir=out)
        return strategy.run(grid, model, checkpoint=checkpoint, resume=resume)

    return run_experiment(cfg, out, data_root=data_root, progress=progress, trainer=flower_trainer(train_on_flower),
                          resume=bool(_setting(settings, "resume", False, _flag)))


def _flag(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")


def build_server_app(settings: dict | None = None, sink: dict | None = None):
    """A ServerApp whose ``main`` runs a pflkit experiment (`serve`).

    ``settings`` are merged over the run config (``flwr run --run-config`` / the
    ``[tool.flwr.app.config]`` table); ``sink["results"]`` receives the results dict
    (for in-process callers such as `pflkit.flower.simulation.run_flower`).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context) -> None:
        merged = {**dict(context.run_config), **(settings or {})}
        results = serve(grid, merged)
        if sink is not None:
            sink["results"] = results

    return app
