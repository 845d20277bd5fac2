"""Run a pflkit experiment as a local Flower simulation.

`run_flower(cfg, out)` builds the pflkit ServerApp and ClientApp and runs them with
``flwr.simulation.run_simulation``: one virtual SuperNode per client (node
``partition-id`` = pflkit client id), Ray actors executing the ClientApp, the
ServerApp in a thread of this process. ``backend="inprocess"`` runs the very same
apps and messages through `LocalGrid` instead: no Ray, one process, clients one
after another; for debugging, notebooks and tests where Ray's start-up (10-20 s on a
busy 2-core machine) would dominate.

CPU threads: each virtual client gets ``client_cpus`` CPUs from Ray and the ClientApp
sets torch's intra-op threads to exactly that (`pflkit.flower.runtime.set_threads`);
letting every actor use all cores made rounds 3x slower here.
"""
from __future__ import annotations

import logging
import os
import pickle
import random
import time
import traceback
import uuid
from pathlib import Path
from typing import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid, ServerApp

from pflkit.run.experiment_config import ExperimentConfig
from pflkit.flower.client_app import build_client_app
from pflkit.flower.runtime import settings_for
from pflkit.flower.serve import build_server_app

log = logging.getLogger(__name__)

BACKENDS = ("ray", "inprocess")
NODE_UNAVAILABLE = ("Error: Node Unavailable - The destination node failed to report a heartbeat within "
                    "2 x its expected interval.")


class LocalGrid(Grid):
    """A Grid that hands each message to a ClientApp in this process (Flower's message path, no Ray).

    Nodes get random 63-bit ids and a shuffled partition each, as on a real federation;
    messages, replies and node contexts are pickled on the way, like Ray does; a
    ClientApp exception becomes an error reply and leaves the node's context unchanged,
    as in Flower's simulation engine. A reply that takes longer than ``timeout`` is
    dropped (the client ran; the server does not see it). `kill` and `restart` act out a
    SuperNode that dies (it leaves the online nodes; a message to it is answered by the
    SuperLink, node 1, with Flower's node-unavailable error) and one started again (a new
    node id, the same node config).
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, seed: int = 0, node_config: dict | None = None):
        _set_task_identity()
        rng = random.Random(seed)
        parts = list(range(num_nodes))
        rng.shuffle(parts)
        self.client_app = client_app
        self.contexts: dict[int, Context] = {}
        for pid in parts:
            node = rng.getrandbits(63) or 1
            config = {"partition-id": pid, "num-partitions": num_nodes, **(node_config or {})}
            self.contexts[node] = Context(run_id=0, node_id=node, node_config=config, state=RecordDict(),
                                          run_config={})
        self._run = None
        self._replies: dict[str, Message] = {}
        self._rng = rng
        self.dead: set[int] = set()

    def node_of(self, partition: int) -> int:
        """The live node that holds ``partition``."""
        return next(n for n, c in self.contexts.items() if n not in self.dead and c.node_config["partition-id"] ==
                    partition)

    def kill(self, partition: int) -> int:
        """The node holding ``partition`` dies (returns its id)."""
        node = self.node_of(partition)
        self.dead.add(node)
        return node

    def restart(self, partition: int) -> int:
        """A SuperNode for ``partition`` starts again after `kill`: a new node id, the dead node's config
        (its state folder included), an empty context state (a fresh process); returns the new id."""
        old = next(n for n in self.dead if self.contexts[n].node_config["partition-id"] == partition)
        node = self._rng.getrandbits(63) or 2
        self.contexts[node] = Context(run_id=0, node_id=node, node_config=dict(self.contexts[old].node_config),
                                      state=RecordDict(), run_config={})
        return node

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.dead]  # Flower lists the online nodes

    def _deliver(self, msg: Message) -> Message:
        msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as Flower's grids do when they push it
        msg = pickle.loads(pickle.dumps(msg))
        node = msg.metadata.dst_node_id
        if node in self.dead:  # what Flower's SuperLink answers for a node that stopped its heartbeats
            reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=NODE_UNAVAILABLE), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            return pickle.loads(pickle.dumps(reply))
        context = pickle.loads(pickle.dumps(self.contexts[node]))
        try:
            reply = self.client_app(msg, context)
            self.contexts[node] = context
        except Exception as e:  # noqa: BLE001 - any ClientApp failure is reported, as Flower does
            log.debug("client app on node %s raised: %s", node, e)
            # the whole traceback, as Flower's engines send it: the server keeps one line and logs the rest
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                  reason="".join(traceback.format_exception(e))), reply_to=msg)
        return pickle.loads(pickle.dumps(reply))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            self._replies[mid] = self._deliver(msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(m) for m in message_ids if m in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            t0 = time.perf_counter()
            reply = self._deliver(msg)
            if timeout is None or time.perf_counter() - t0 <= timeout:
                replies.append(reply)
        return replies


def _set_task_identity() -> None:
    """What run_simulation does for its Python API: messages built in this process need a run identity."""
    try:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 0, 1, SUPERLINK_NODE_ID
    except ImportError:  # older Flower: the Message constructor needs no identity
        pass


def run_inprocess(server_app: ServerApp, client_app: ClientApp, num_nodes: int, seed: int = 0,
                  grid: LocalGrid | None = None) -> LocalGrid:
    """Run ``server_app`` against ``num_nodes`` in-process nodes (or ``grid``'s); returns the grid."""
    _set_task_identity()
    grid = grid if grid is not None else LocalGrid(client_app, num_nodes, seed=seed)
    server_app(grid, Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    return grid


def ray_backend_config(client_cpus: float = 1, num_cpus: int | None = None) -> dict:
    """Ray settings: ``client_cpus`` per virtual client, ``num_cpus`` for the whole simulation (default: all)."""
    return {"client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0},
            "init_args": {"num_cpus": int(num_cpus or os.cpu_count() or 1), "logging_level": "error",
                          "log_to_driver": False}}


def run_flower(cfg: ExperimentConfig, out, *, data_root=None, backend: str = "ray", client_cpus: float = 1,
               num_cpus: int | None = None, timeout: float | None = None, faults: dict | None = None,
               progress: bool = False, node_seed: int = 0, verbose: bool = False,
               node_wait: float | None = None, resume: bool = False, client_state_dir=None) -> dict:
    """Run ``cfg`` (every seed and stage) on Flower; writes ``out/results.json`` and returns the results.

    Args:
        cfg: a resolved experiment (`pflkit.run.experiments.resolve`).
        out: output folder (the same files as a pflkit run).
        data_root: dataset folder (None: pflkit's default search).
        backend: ``"ray"`` (``flwr.simulation.run_simulation``) or ``"inprocess"`` (`LocalGrid`).
        client_cpus: CPUs (and torch threads) per virtual client.
        num_cpus: CPUs Ray may use in total (None: all).
        timeout: seconds to wait for a round's replies (None: wait for every client).
        faults: injected client failures, ``{"STAGE/CID/ROUND": "raise" | "sleep:SECONDS"}``; ROUND is
            1-based, ``*`` (every training round), ``val`` (every validation pass) or ``test``.
        node_seed: shuffles node ids and partitions of the in-process grid.
        node_wait: seconds to wait at start for a node of every client to answer (None: 120).
        resume: continue the stopped run in ``out`` (as ``pflkit run --resume``).
        client_state_dir: where the virtual clients also keep their states so that a resume finds
            them (default ``out/client-states``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if client_cpus <= 0:
        raise ValueError(f"client_cpus={client_cpus!r}: must be > 0")
    extra = {"round-timeout": float(timeout or 0.0), "progress": bool(progress), "resume": bool(resume),
             "client-state-dir": str(Path(client_state_dir or Path(out) / "client-states").resolve())}
    if node_wait is not None:
        extra["node-wait"] = float(node_wait)
    settings = settings_for(cfg, data_root, out=str(Path(out)), **extra)
    sink: dict = {}
    server, client = build_server_app(settings, sink), build_client_app(faults)
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    if not verbose:  # Flower's per-round INFO / DEBUG lines; pflkit logs its own rounds
        flwr_log.setLevel(logging.WARNING)
    try:
        if backend == "inprocess":
            run_inprocess(server, client, cfg.data.num_clients, seed=node_seed)
        else:
            from flwr.simulation import run_simulation

            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            run_simulation(server, client, num_supernodes=cfg.data.num_clients,
                           backend_config=ray_backend_config(client_cpus, num_cpus), verbose_logging=verbose)
    finally:
        flwr_log.setLevel(level)
    if "results" not in sink:
        raise RuntimeError("the Flower ServerApp ended without results; see the log above")
    return sink["results"]
