"""Transports: how the round loop reaches the clients.

`pflkit.fl.loop.run_rounds` owns everything a stage decides (sampling, aggregation, the
history row, validation schedule, keep-best, divergence, checkpoints, the test pass). A
transport only carries the loop's messages to the clients and brings their answers back:

``train(state, ids, env) -> RoundWork``
    in the round of ``env`` (`Env.at_round`): ``algo.send`` for each sampled client, its
    ``algo.respond`` wherever that client lives (both wrap the algorithm's phases in the
    participation protocol, `pflkit.fl.sampling`), the updates back in the order of ``ids``
    (those that answered), the bytes that travelled and the clients that failed (id -> one-line reason).
``evaluate(state, ids, split, env, at_best) -> Evaluation``
    each client's metrics on ``split`` with the evaluation view of the state
    (`Algorithm.eval_view`), with the client states of the best round when ``at_best``.
``mark_best(round_)``
    the round keep-best has just chosen (its client states must stay available).
``saved(round_)`` / ``snapshot()`` / ``restore(snapshot)``
    checkpoints: the loop saved one at ``round_``; what the transport adds to it; resuming.
``client_states(at_best) -> dict``
    the client states the stage's result keeps (``{}`` where they live on remote clients).

`LocalTransport` runs the clients in this process (the engines of `pflkit.fl.engines`);
`pflkit.flower.server_app.PflkitStrategy` sends the same messages over a Flower Grid.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol


from pflkit.fl.algorithm import Algorithm, Env, Update
from pflkit.fl.engines import available_cpus, evaluate_vectorized, nbytes, round_engine, train_clients


@dataclass
class RoundWork:
    """One round's client work: updates in sampling order, bytes down / up, failures, engine used."""

    updates: list[Update]
    down: int
    up: int
    failures: dict[int, str] = field(default_factory=dict)
    engine: str = ""


@dataclass
class Evaluation:
    """Per-client metrics of an evaluation pass, the clients that failed, the bytes sent and the engine
    that ran the pass in this process ("" when the clients ran elsewhere)."""

    per_client: dict[int, dict]
    failures: dict[int, str] = field(default_factory=dict)
    down: int = 0
    engine: str = ""


class Transport(Protocol):
    name: str

    def open(self, algo: Algorithm, cfg, fed, env: Env) -> None: ...

    def train(self, state, ids: list[int], env: Env) -> RoundWork: ...

    def evaluate(self, state, ids, split: str, env: Env, at_best: bool = False) -> Evaluation: ...

    def mark_best(self, round_: int) -> None: ...

    def saved(self, round_: int) -> None: ...

    def snapshot(self) -> dict: ...

    def restore(self, snapshot: dict) -> None: ...

    def client_states(self, at_best: bool = False) -> dict: ...


def evaluate_clients(algo: Algorithm, state, client_states: dict, fed, ids, cfg, env: Env, split: str) -> Evaluation:
    """Each client of ``ids`` evaluated on ``split`` in this process, from what would travel to it
    (`Algorithm.eval_view`); the bytes are those views'. Under the ``vectorized`` engine the
    clients are evaluated together (their fine-tuning batched), else one after another."""
    ids = list(ids)
    if round_engine(algo, env, len(ids), available_cpus()) == "vectorized":
        metrics, down = evaluate_vectorized(algo, state, ids, fed, client_states, cfg, env, split)
        return Evaluation(metrics, {}, down, "vectorized")
    out, down = {}, 0
    for cid in ids:
        env.seed_torch("eval", cid, split)
        view = algo.eval_view(state, cid, cfg, env)
        out[cid] = algo.evaluate_view(view, fed.clients[cid], client_states.get(cid), cfg, env, split)
        down += nbytes(view)
    return Evaluation(out, {}, down, "sequential")


class LocalTransport:
    """The clients in this process: their states in a dict, their updates run by ``env.engine``."""

    name = "local"

    def __init__(self):
        self.states: dict[int, Any] = {}
        self.best_states: dict[int, Any] | None = None

    def open(self, algo: Algorithm, cfg, fed, env: Env) -> None:
        self.algo, self.cfg, self.fed = algo, cfg, fed
        self.cpus = available_cpus()

    def train(self, state, ids: list[int], env: Env) -> RoundWork:
        results, engine = train_clients(self.algo, state, ids, self.fed, self.states, self.cfg, env, self.cpus)
        updates = [upd for upd, _, _ in results]
        return RoundWork(updates, sum(d for _, _, d in results), sum(nbytes(u.payload) for u in updates), {}, engine)

    def evaluate(self, state, ids, split: str, env: Env, at_best: bool = False) -> Evaluation:
        return evaluate_clients(self.algo, state, self.client_states(at_best), self.fed, ids, self.cfg, env, split)

    def mark_best(self, round_: int) -> None:
        self.best_states = copy.deepcopy(self.states)

    def saved(self, round_: int) -> None:
        pass

    def snapshot(self) -> dict:
        return {"client_states": self.states, "best_client_states": self.best_states}

    def restore(self, snapshot: dict) -> None:
        self.states = snapshot.get("client_states") or {}
        self.best_states = snapshot.get("best_client_states")

    def client_states(self, at_best: bool = False) -> dict:
        return self.best_states if at_best and self.best_states is not None else self.states
