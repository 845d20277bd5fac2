"""The server side: pflkit's round loop with its messages on a Flower Grid.

`PflkitStrategy` is the loop's transport (`pflkit.fl.transport`) over Flower's message
API and, for Flower, a `Strategy` whose methods are the loop's steps in messages. The
loop (`pflkit.fl.loop.run_rounds`) samples the clients, aggregates, writes the history
row, validates, keeps the best state, checks for divergence, checkpoints and tests,
exactly as for a local run; this module only:

* ``configure_train``: calls ``algo.send(state, cid, ...)`` for each sampled client
  and addresses the message to the node whose ``partition-id`` is ``cid`` (pFedHN sends
  each node its generated weights, the hypernetwork never leaves the server);
* ``aggregate_train`` / ``aggregate_evaluate``: decode the replies into the loop's updates and
  metrics in the loop's client order (replies arrive in any order; the loop's floating-point sums
  must not change); a reply is matched to its message by the message id it answers;
* before each step, nodes that joined since are mapped: a restarted SuperNode takes its
  partition's client over (`pflkit.flower.nodes.NodeMap`: the newest claim wins);
* ``configure_evaluate`` / ``aggregate_evaluate``: an evaluation pass with each client's
  view of the state (`pflkit.fl.algorithm.Algorithm.eval_view`), at keep-best's round for
  the test pass;
* a client that raises, or does not answer within ``timeout`` seconds, is left out of
  that round (the loop's row names it: ``failed``, ``failures``: client -> one-line
  reason; ``val_failed``, ``val_failures`` for a validation pass); a client whose *test*
  evaluation fails has NaN metrics with ``failed`` and makes the stage ``"incomplete"``.
  The full text of every failure (a Ray traceback) goes to the log and to
  ``flower-failures.log`` in ``log_dir`` (`pflkit.flower.failures`);
* the bytes in the history are the tensors that really travelled.

Message parts that did not change for a whole round (FedL2P's pretrained theta_g) are
cached on the nodes (`TokenTable`): after a node holds one, it receives a version
token instead, so FedL2P sends the model once per node and then only lambda.
"""
from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import replace as dc_replace
from typing import Any, Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from pflkit.fl.algorithm import Algorithm, Env, Update, check_config
from pflkit.fl.loop import StageResult, run_rounds, summarize
from pflkit.fl.train import Diverged, set_state
from pflkit.fl.transport import Evaluation, RoundWork
from pflkit.flower import records
from pflkit.flower.client_app import HEADER, METRICS, MSG, PAYLOAD
from pflkit.flower.failures import FailureLog
from pflkit.flower.nodes import NodeMap
from pflkit.flower.records import tensors_in
from pflkit.run.environment import initial_model

log = logging.getLogger(__name__)


class TokenTable:
    """Version tokens of message parts: the same object, unmodified, keeps its token.

    ``token(obj, round)`` returns (token, round the token was issued). A part is worth
    caching on the nodes once it has outlived a round (issued before the current one).
    """

    def __init__(self, keep: int = 8):
        self._known: OrderedDict[int, tuple] = OrderedDict()
        self._next, self._keep = 0, keep

    def token(self, obj, round_: int) -> tuple[int, int]:
        fingerprint = tuple((id(t), t._version) for t in tensors_in(obj))
        hit = self._known.get(id(obj))
        if hit is not None and hit[0] is obj and hit[1] == fingerprint:
            self._known.move_to_end(id(obj))
            return hit[2], hit[3]
        self._next += 1
        self._known[id(obj)] = (obj, fingerprint, self._next, round_)  # holding obj keeps its id unique
        while len(self._known) > self._keep:
            self._known.popitem(last=False)
        return self._next, round_


class PflkitStrategy(Strategy):
    """One pflkit stage's messages on Flower: a `pflkit.fl.transport.Transport` for `run_rounds`.

    The loop decides everything (sampling, aggregation, history, validation, keep-best,
    checkpoints, the test pass); this class only turns its steps into Flower messages and
    their replies back into updates and metrics. Flower's Strategy methods are those steps:
    ``configure_train`` / ``aggregate_train`` (broadcast, collect the updates) and
    ``configure_evaluate`` / ``aggregate_evaluate`` (an evaluation pass); ``start`` runs the
    stage through the loop.
    """

    name = "flower"

    def __init__(self, algo: Algorithm, cfg, fed, env: Env, nodes: NodeMap, header: dict, *,
                 timeout: float | None = None, desc: str | None = None, log_dir=None):
        check_config(algo, cfg)
        self.algo, self.cfg, self.fed, self.env, self.nodes = algo, cfg, fed, env, nodes
        self.header, self.timeout, self.desc = dict(header), timeout, desc
        self.failure_log = FailureLog(log_dir)  # full texts of client failures (``log_dir/flower-failures.log``)
        self.tokens = TokenTable()
        self.held: dict[int, dict[str, int]] = {}  # what each client caches: part -> token
        self.best_round = -1  # keep-best's round (-1: none yet); clients keep their state as of it
        self.saved_round = -1  # the last checkpoint's round: a resumed run continues from those states
        self.with_state: set[int] = set()  # clients that hold a state of this stage
        self.result: StageResult | None = None
        self.grid: Grid | None = None
        self._state: Any = None
        self._ids: list[int] = []
        self._split = "val"
        self._at_best = False
        self._pending: dict[int, tuple] = {}  # node -> (cid, parts it will cache, bytes sent)
        self._missing: list[int] = []
        self._last_encoded: tuple = (None, None, None)

    # ------------------------------------------------------------ the loop's transport

    def open(self, algo, cfg, fed, env) -> None:
        self.summary()
        if self.grid is not None:
            self.nodes.refresh(self.grid, self.timeout)

    def train(self, state, ids: list[int], env) -> RoundWork:
        self.env, round_index = env, env.round  # the round's context, for the messages of this step
        self._look_for_nodes()
        self._state, self._ids = state, list(ids)
        if round_index == 0 and isinstance(state, dict):  # parts of the initial state are stable from the start
            for part in state.values():
                self.tokens.token(part, 0)
        msgs = self.configure_train(round_index + 1, ArrayRecord(), ConfigRecord(), self.grid)
        return self._work(self.grid.send_and_receive(msgs, timeout=self.timeout), round_index + 1)

    def evaluate(self, state, ids, split: str, env, at_best: bool = False) -> Evaluation:
        self.env = env
        self._look_for_nodes()
        self._state, self._ids, self._at_best = state, list(ids), at_best
        config = ConfigRecord({"split": split})
        msgs = self.configure_evaluate(self.env.round + 1, ArrayRecord(), config, self.grid)
        got, failures, down, _ = self._collect(self.grid.send_and_receive(msgs, timeout=self.timeout),
                                               f"round {self.env.round + 1} {split}" if split == "val" else split)
        failures.update({cid: self.nodes.absent(cid) for cid in self._missing})
        return Evaluation({cid: dict(content[METRICS]) for cid, content in got.items()}, failures, down)

    def _look_for_nodes(self) -> None:
        """Map nodes that joined since the last step (a restarted SuperNode: a new node id, the same
        partition, takes its client over from this round on; `NodeMap`: the newest claim wins)."""
        if self.grid is not None:
            self.nodes.refresh(self.grid, self.timeout)

    def mark_best(self, round_: int) -> None:
        self.best_round = round_

    def saved(self, round_: int) -> None:
        self.saved_round = round_

    def snapshot(self) -> dict:
        return {"best_round": self.best_round, "saved_round": self.saved_round, "with_state": sorted(self.with_state)}

    def restore(self, snapshot: dict) -> None:
        """Resuming: the clients read their states as of the checkpoint (their node's state folder keeps
        them across runs); a client that should hold one and does not fails instead of starting afresh."""
        self.best_round = int(snapshot.get("best_round", -1))
        self.saved_round = int(snapshot.get("saved_round", -1))
        self.with_state = set(snapshot.get("with_state", []))

    def client_states(self, at_best: bool = False) -> dict:
        return {}  # they live on the clients

    # ------------------------------------------------------------ messages

    def _keep_from(self) -> int:
        """The oldest round whose client states may still be read: keep-best's, the last checkpoint's."""
        marks = [r for r in (self.best_round if self.cfg.keep_best else -1, self.saved_round) if r >= 0]
        return min(marks) if marks else -1

    def _message(self, cid: int, obj, kind: str, header: dict, store: bool = True) -> Message | None:
        node = self.nodes.node_of.get(cid)
        if node is None and self.grid is not None:
            self.nodes.refresh(self.grid, self.timeout)
            node = self.nodes.node_of.get(cid)
        if node is None:
            return None
        hold, cache = {}, {}
        if isinstance(obj, dict):
            held = self.held.get(cid, {})
            for key, part in obj.items():
                if isinstance(key, str) and isinstance(part, (dict, list, tuple)) and tensors_in(part):
                    token, issued = self.tokens.token(part, self.env.round + 1)
                    if held.get(key) == token:
                        hold[key] = token
                    elif store and issued <= self.env.round:  # unchanged for a whole round: worth caching
                        cache[key] = token
        h = {**self.header, **header, "cid": cid, "round": self.env.round, "hold": json.dumps(hold),
             "store": json.dumps(cache), "keep-from": self._keep_from(), "has-state": int(cid in self.with_state)}
        content = RecordDict({HEADER: ConfigRecord(h)})
        body = self._encoded(obj, tuple(hold))
        content[f"{MSG}.{records.ARRAYS}"], content[f"{MSG}.{records.TREE}"] = body
        nbytes = records.record_nbytes(content)
        msg = Message(content, dst_node_id=node, message_type=kind, group_id=str(self.env.round + 1))
        self._pending[node] = (cid, cache, nbytes, msg)  # the grid gives msg its id when it pushes it
        return msg

    def _encoded(self, obj, held: tuple) -> tuple:
        """The message's records without its ``held`` parts; the same object is encoded once per round
        (FedAvg broadcasts one state to every sampled client)."""
        key = (id(obj), held, tuple((id(t), t._version) for t in tensors_in(obj)))
        if self._last_encoded[0] != key or self._last_encoded[2] is not obj:
            send = {k: v for k, v in obj.items() if k not in held} if held else obj
            rec = records.to_record(send)
            self._last_encoded = (key, (rec[records.ARRAYS], rec[records.TREE]), obj)
        return self._last_encoded[1]

    def _collect(self, replies: Iterable[Message], where: str) -> tuple[dict[int, RecordDict], dict[int, str], int, int]:
        """Replies by client id; failures (errors, no reply) by client id, one line each; bytes down / up.

        ``where`` (e.g. ``"round 3"``, ``"test"``) heads each failure's full text in the log.
        A client reporting a non-finite loss or state raises `Diverged` (the stage's outcome).
        """
        got, failures, up = {}, {}, 0
        down = sum(p[2] for p in self._pending.values())
        where = f"{self.header.get('stage', self.algo.name)} (seed {self.header.get('seed', self.env.seed)}) {where}"
        # a reply is matched to its message by the id it answers: Flower's "node unavailable" reply for a
        # dead node comes from the SuperLink (node 1), not from the node it was sent to
        sent = {p[3].metadata.message_id: node for node, p in self._pending.items() if p[3].metadata.message_id}
        for rep in replies:
            node = sent.get(rep.metadata.reply_to_message_id) if sent else rep.metadata.src_node_id
            cid, store, _, _ = self._pending.pop(node, (None, None, 0, None))
            if cid is None:
                continue  # a late reply to an older message
            if rep.has_error():
                failures[cid] = self.failure_log.record(where, cid, rep.error.reason)
                self.held.pop(cid, None)  # its cache may be incomplete: resend everything next time
                continue
            if "diverged" in rep.content[HEADER]:
                self._pending.clear()
                raise Diverged(f"client {cid}: {rep.content[HEADER]['diverged']}")
            self.held.setdefault(cid, {}).update(store)
            got[cid] = rep.content
            up += records.record_nbytes(rep.content)
        for cid, _, _, _ in self._pending.values():
            late = "no reply" if self.timeout is None else f"no reply within {self.timeout:g} s"
            failures[cid] = self.failure_log.record(where, cid, late)
            self.held.pop(cid, None)
        self._pending.clear()
        order = {cid: i for i, cid in enumerate(self._ids)}  # the loop's client order, never arrival order
        return ({cid: got[cid] for cid in sorted(got, key=lambda c: (order.get(c, len(order)), c))},
                {cid: failures[cid] for cid in sorted(failures, key=lambda c: (order.get(c, len(order)), c))},
                down, up)

    def _work(self, replies: Iterable[Message], server_round: int) -> RoundWork:
        got, failures, down, up = self._collect(replies, f"round {server_round}")
        failures.update({cid: self.nodes.absent(cid) for cid in self._missing})
        self.with_state.update(cid for cid, c in got.items() if int(c[HEADER].get("has-state", 0)))
        return RoundWork([_update(got[cid]) for cid in self._ids if cid in got], down, up, failures, "flower")

    # ------------------------------------------------------------ Flower's Strategy interface

    def summary(self) -> None:
        log.info("pflkit %s on Flower: %d rounds, %s sampling r=%s, %d clients", self.algo.name, self.cfg.rounds,
                 self.cfg.sampling, self.cfg.fraction, self.fed.num_clients)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Each of the loop's sampled clients' ``algo.broadcast`` message."""
        msgs = [self._message(cid, self.algo.send(self._state, cid, self.cfg, self.env), "train", {})
                for cid in self._ids]
        self._missing = [cid for cid, m in zip(self._ids, msgs) if m is None]
        return [m for m in msgs if m is not None]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord]:
        """The replies decoded into the loop's updates (the loop aggregates them); their count as metrics."""
        work = self._work(replies, server_round)
        return None, MetricRecord({"completed": len(work.updates), "failed": len(work.failures)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """``config["split"]`` ("val" or "test"): each client's evaluation view (`Algorithm.eval_view`)."""
        split = self._split = str(config.get("split", "val"))
        at = self.best_round if self._at_best else -1
        msgs = [self._message(cid, self.algo.eval_view(self._state, cid, self.cfg, self.env), "evaluate",
                              {"split": split, "state-round": at}, store=split != "test") for cid in self._ids]
        self._missing = [cid for cid, m in zip(self._ids, msgs) if m is None]
        return [m for m in msgs if m is not None]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """The mean accuracy and loss over the clients that answered."""
        got, _, _, _ = self._collect(replies, f"round {server_round} {self._split}")
        return MetricRecord(summarize({cid: dict(content[METRICS]) for cid, content in got.items()}))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Flower's entry point: train from the model in ``initial_arrays`` (a state dict) and test.

        ``num_rounds`` / ``timeout`` override the config's rounds and the strategy's timeout.
        The pflkit outcome (history, per-client test metrics) is in ``self.result``.
        """
        if num_rounds is not None:
            self.cfg = dc_replace(self.cfg, rounds=num_rounds)
        self.timeout = self.timeout if timeout is None else timeout
        model = set_state(initial_model(self.env), initial_arrays.to_torch_state_dict())
        self.result = self.run(grid, model)
        return self.flower_result()

    def run(self, grid: Grid, model: torch.nn.Module, *, checkpoint=None, resume: bool = False) -> StageResult:
        """The stage through pflkit's round loop, its messages on ``grid``."""
        self.grid = grid
        self.result = run_rounds(self.algo, self.cfg, self.fed, model, self.env, checkpoint=checkpoint,
                                 resume=resume, desc=self.desc, transport=self)
        return self.result

    def flower_result(self) -> Result:
        """The stage as Flower's `Result`: global arrays (if the algorithm has a global model) and metrics."""
        res = Result()
        weights = self.algo.global_model(self.result.state) if self.result else None
        if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
            res.arrays = ArrayRecord(weights)
        for row in self.result.history if self.result else []:
            nums = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            res.train_metrics_clientapp[row["round"]] = MetricRecord(
                {k: v for k, v in nums.items() if not k.startswith("val_")})
            if "val_acc" in row:
                res.evaluate_metrics_clientapp[row["round"]] = MetricRecord(
                    {"val_acc": row["val_acc"], "val_loss": row["val_loss"]})
        return res


def _update(content: RecordDict) -> Update:
    h = content[HEADER]
    return Update(int(h["client-id"]), int(h["num-samples"]), records.get(content, PAYLOAD), dict(content[METRICS]))
