"""The server side: a Flower `Strategy` that runs any pflkit algorithm's server phases.

`PflkitStrategy` implements Flower's message-based Strategy (``configure_train``,
``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``, ``summary``,
``start``) over one pflkit algorithm:

* ``configure_train`` samples the round's clients with `pflkit.fl.loop.sample_clients`
  (the same seed and schedule as the single-process loop), calls
  ``algo.broadcast(state, cid, ...)`` for each and addresses the message to the node
  whose ``partition-id`` is ``cid``: pFedHN sends each node its generated weights, the
  hypernetwork never leaves the server;
* ``aggregate_train`` decodes the replies, puts them in sampling order (replies arrive
  in any order; the loop's floating-point sums must not change) and calls
  ``algo.aggregate``: FedAvg's weighted mean, FedL2P's mean of lambda, pFedHN's
  vector-Jacobian step, FedSelect's masked mean with the OR-ed mask, pFedVEM's
  precision-weighted head;
* a client that raises, or does not answer within ``timeout`` seconds, is left out of
  that round's aggregation; the round completes with the others and the history row
  names it (``failed``, ``failures``: client -> one-line reason; ``val_failed``,
  ``val_failures`` for the validation pass). A client whose *test* evaluation fails has NaN
  metrics with ``failed`` and makes the stage ``"incomplete"`` (``StageResult.missing``:
  ``[{"client", "reason"}]``). The full text of every failure (a Ray traceback) goes to the
  log and to ``flower-failures.log`` in ``log_dir`` (`pflkit.flower.failures`);
* the history rows are the loop's (``train_loss``, ``bytes_down``, ``bytes_up``,
  ``val_acc``, ...): the bytes are the tensors that really travelled.

Message parts that did not change for a whole round (FedL2P's pretrained theta_g) are
cached on the nodes (`TokenTable`): after a node holds one, it receives a version
token instead, so FedL2P sends the model once per node and then only lambda.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections import OrderedDict
from dataclasses import replace as dc_replace
from typing import Any, Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from tqdm.auto import tqdm

from pflkit.fl.algorithm import Algorithm, Env, Update, check_config
from pflkit.fl.loop import StageResult, _score, check_finite, eval_clients, sample_clients, summarize
from pflkit.fl.train import Diverged, set_state
from pflkit.flower import records
from pflkit.flower.client_app import HEADER, METRICS, MSG, PAYLOAD
from pflkit.flower.failures import FailureLog
from pflkit.flower.nodes import NodeMap
from pflkit.flower.records import tensors_in
from pflkit.flower.specs import eval_spec

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
    """One pflkit algorithm as a Flower Strategy (see the module docstring)."""

    def __init__(self, algo: Algorithm, cfg, fed, env: Env, nodes: NodeMap, header: dict, *,
                 timeout: float | None = None, desc: str | None = None, log_dir=None):
        check_config(algo, cfg)
        self.algo, self.cfg, self.fed, self.env, self.nodes = algo, cfg, fed, env, nodes
        self.header, self.timeout, self.desc = dict(header), timeout, desc
        self.failure_log = FailureLog(log_dir)  # full texts of client failures (``log_dir/flower-failures.log``)
        self.spec = eval_spec(algo)
        self.state: Any = None
        self.tokens = TokenTable()
        self.held: dict[int, dict[str, int]] = {}  # what each client caches: part -> token
        self.best: tuple | None = None
        self.history: list[dict] = []
        self.result: StageResult | None = None
        self._pending: dict[int, tuple] = {}  # node -> (cid, parts it will cache, bytes sent)
        self._grid: Grid | None = None
        self._ids: list[int] = []
        self._updates: list[Update] = []
        self._row: dict = {}
        self._eval: dict[int, dict] = {}
        self._eval_failures: dict[int, str] = {}
        self._eval_bytes = 0
        self._eval_split = "val"
        self._missing: list[int] = []
        self._test_state: Any = None
        self._last_encoded: tuple = (None, None, None)

    # ------------------------------------------------------------ messages

    def _message(self, cid: int, obj, kind: str, header: dict, store: bool = True) -> Message | None:
        node = self.nodes.node_of.get(cid)
        if node is None and self._grid is not None:
            self.nodes.refresh(self._grid, self.timeout)
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
             "store": json.dumps(cache)}
        content = RecordDict({HEADER: ConfigRecord(h)})
        body = self._encoded(obj, tuple(hold))
        content[f"{MSG}.{records.ARRAYS}"], content[f"{MSG}.{records.TREE}"] = body
        nbytes = records.record_nbytes(content)
        self._pending[node] = (cid, cache, nbytes)
        return Message(content, dst_node_id=node, message_type=kind, group_id=str(self.env.round + 1))

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
        """
        got, failures, up = {}, {}, 0
        down = sum(p[2] for p in self._pending.values())
        where = f"{self.header.get('stage', self.algo.name)} (seed {self.header.get('seed', self.env.seed)}) {where}"
        for rep in replies:
            cid, store, _ = self._pending.pop(rep.metadata.src_node_id, (None, None, 0))
            if cid is None:
                continue  # a late reply to an older message
            if rep.has_error():
                failures[cid] = self.failure_log.record(where, cid, rep.error.reason)
                self.held.pop(cid, None)  # its cache may be incomplete: resend everything next time
                continue
            if "diverged" in rep.content[HEADER]:
                raise Diverged(f"client {cid}: {rep.content[HEADER]['diverged']}")
            self.held.setdefault(cid, {}).update(store)
            got[cid] = rep.content
            up += records.record_nbytes(rep.content)
        for cid, _, _ in self._pending.values():
            late = "no reply" if self.timeout is None else f"no reply within {self.timeout:g} s"
            failures[cid] = self.failure_log.record(where, cid, late)
            self.held.pop(cid, None)
        self._pending.clear()
        return got, failures, down, up

    # ------------------------------------------------------------ Flower's Strategy interface

    def summary(self) -> None:
        log.info("pflkit %s on Flower: %d rounds, %s sampling r=%s, %d clients", self.algo.name, self.cfg.rounds,
                 self.cfg.sampling, self.cfg.fraction, self.fed.num_clients)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The round's clients (pflkit's sampling) and each one's ``algo.broadcast`` message."""
        self._grid, self.env.round = grid, server_round - 1
        self._ids = sample_clients(self.fed.seen_ids, self.cfg, self.env, self.env.round)
        best = -1 if not self.cfg.keep_best else (self.best[1] if self.best else 0)
        msgs = [self._message(cid, self.algo.broadcast(self.state, cid, self.cfg, self.env), "train", {"best": best})
                for cid in self._ids]
        self._missing = [cid for cid, m in zip(self._ids, msgs) if m is None]
        return [m for m in msgs if m is not None]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord]:
        """``algo.aggregate`` over the clients that answered, in sampling order; the round's history row."""
        got, failures, down, up = self._collect(replies, f"round {server_round}")
        failures.update({cid: self.nodes.absent(cid) for cid in self._missing})
        updates = [_update(got[cid]) for cid in self._ids if cid in got]
        if updates:
            self.state = self.algo.aggregate(self.state, updates, self.cfg, self.env)
            check_finite(self.state, "state", f"after the aggregation of round {server_round}")  # as the loop
        else:
            log.warning("%s round %d: no client answered; the state is unchanged", self.algo.name, server_round)
        self._updates = updates
        n = sum(u.num_samples for u in updates) or 1
        losses = [u.metrics["loss"] * u.num_samples for u in updates if "loss" in u.metrics]
        row = {"round": server_round, "clients": len(self._ids), "train_loss": sum(losses) / n if losses else None,
               "bytes_down": down, "bytes_up": up, "completed": len(updates), "failed": sorted(failures),
               "failures": {str(c): r for c, r in sorted(failures.items())}}
        if row["train_loss"] is not None and not math.isfinite(row["train_loss"]):
            raise Diverged(f"non-finite training loss in round {server_round}")
        keys = {k for u in updates for k in u.metrics} - {"loss"}
        row.update({f"client_{k}": float(np.mean([u.metrics[k] for u in updates if k in u.metrics])) for k in keys})
        self._row = row
        return None, MetricRecord({k: v for k, v in row.items() if isinstance(v, (int, float))
                                   and not isinstance(v, bool)})

    def _wants_validation(self, server_round: int) -> bool:
        every = self.cfg.eval_every
        return bool(every) and (server_round % every == 0 or server_round == self.cfg.rounds)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """``config["split"]``: "val" (the scheduled validation pass, else no messages) or "test" (every client)."""
        split = self._eval_split = str(config.get("split", "val"))
        self._missing = []
        if split == "val" and not self._wants_validation(server_round):
            return []
        ids = list(range(self.fed.num_clients)) if split == "test" else self.val_ids
        at = int(config.get("state-round", -1))
        msgs = [self._message(cid, self.spec.view(self._eval_state(split), cid, self.cfg, self.env), "evaluate",
                              {"split": split, "state-round": at}, store=split != "test") for cid in ids]
        self._missing = [cid for cid, m in zip(ids, msgs) if m is None]
        return [m for m in msgs if m is not None]

    def _eval_state(self, split: str):
        return self._test_state if split == "test" else self.state

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord:
        """Per-client metrics into ``self._eval``; the mean accuracy and loss over clients."""
        split = self._eval_split
        got, failures, down, _ = self._collect(replies, f"round {server_round} {split}" if split == "val" else split)
        failures.update({cid: self.nodes.absent(cid) for cid in self._missing})
        self._eval = {cid: dict(content[METRICS]) for cid, content in got.items()}
        self._eval_failures, self._eval_bytes = failures, down
        mean = summarize(self._eval)
        return MetricRecord({k: v for k, v in mean.items()})

    @property
    def val_ids(self) -> list[int]:
        return eval_clients(self.fed.seen_ids, self.cfg, self.env)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Flower's entry point: train from the model in ``initial_arrays`` (a state dict) and test.

        ``num_rounds`` / ``timeout`` override the config's rounds and the strategy's timeout.
        The pflkit outcome (history, per-client test metrics) is in ``self.result``.
        """
        from pflkit.runner import initial_model

        if num_rounds is not None:
            self.cfg = dc_replace(self.cfg, rounds=num_rounds)
        self.timeout = self.timeout if timeout is None else timeout
        model = set_state(initial_model(self.env), initial_arrays.to_torch_state_dict())
        self.result = self.run(grid, model)
        return self.flower_result()

    # ------------------------------------------------------------ the stage, as pflkit.fl.loop.run_rounds

    def run(self, grid: Grid, model: torch.nn.Module) -> StageResult:
        """Train for ``cfg.rounds`` rounds, then test every client (keep-best as in `run_rounds`)."""
        t0 = time.perf_counter()
        self._grid = grid
        self.summary()
        self.state = self.algo.init(model, self.fed, self.cfg, self.env)
        if isinstance(self.state, dict):  # parts of the initial state are stable from the start
            for part in self.state.values():
                self.tokens.token(part, 0)
        self.nodes.refresh(grid, self.timeout)
        bar = tqdm(range(self.cfg.rounds), desc=self.desc, disable=self.desc is None or None)
        try:
            for t in bar:
                self._round(grid, t)
                row = self.history[-1]
                if self.desc is not None:
                    bar.set_postfix({k: f"{row[k]:.3f}" for k in ("train_loss", "val_acc") if row.get(k) is not None})
        except Diverged as e:
            log.warning("%s diverged: %s", self.algo.name, e)
            return StageResult("diverged", self.state, {}, self.history, seconds=time.perf_counter() - t0,
                               error=str(e))
        finally:
            bar.close()
        best_round, self._test_state = None, self.state
        if self.cfg.keep_best and self.best is not None:
            _, best_round, self._test_state = self.best
        result = StageResult("ok", self._test_state, {}, self.history, best_round=best_round)
        try:
            result.set_test(self.test(grid, best_round))  # as the loop: no accuracy -> incomplete
        except Diverged as e:
            result.status, result.error = "diverged", str(e)
        result.seconds = time.perf_counter() - t0
        return result

    def _round(self, grid: Grid, t: int) -> None:
        tr = time.perf_counter()
        replies = grid.send_and_receive(self.configure_train(t + 1, ArrayRecord(), ConfigRecord(), grid),
                                        timeout=self.timeout)
        self.aggregate_train(t + 1, replies)
        row, val = self._row, None
        msgs = self.configure_evaluate(t + 1, ArrayRecord(), ConfigRecord({"split": "val"}), grid)
        if msgs or self._missing:
            val = dict(self.aggregate_evaluate(t + 1, grid.send_and_receive(msgs, timeout=self.timeout)))
            row.update({"val_acc": val["acc"], "val_loss": val["loss"], "bytes_eval": self._eval_bytes})
            if self._eval_failures:
                row["val_failed"] = sorted(self._eval_failures)
                row["val_failures"] = {str(c): r for c, r in sorted(self._eval_failures.items())}
        score = _score(self.cfg, val, self._updates)
        if self.cfg.keep_best and score is not None and (  # `_score` never returns NaN
                self.best is None or score > self.best[0]):
            self.best = (score, t + 1, copy.deepcopy(self.state))
        row["seconds"] = time.perf_counter() - tr
        self.history.append(row)
        log.info("%s round %d: %s", self.algo.name, t + 1, {k: v for k, v in row.items() if k != "round"})

    def test(self, grid: Grid, best_round: int | None) -> dict[int, dict]:
        """Every client's test metrics with the kept state (clients with their state as of ``best_round``).

        A client that failed, did not answer in time or has no node gets NaN metrics and
        ``"failed"``: the one-line reason.
        """
        cfg = ConfigRecord({"split": "test", "state-round": -1 if best_round is None else best_round})
        msgs = self.configure_evaluate(self.cfg.rounds, ArrayRecord(), cfg, grid)
        self.aggregate_evaluate(self.cfg.rounds, grid.send_and_receive(msgs, timeout=self.timeout))
        out = dict(self._eval)
        for cid, reason in self._eval_failures.items():
            out[cid] = {"acc": math.nan, "loss": math.nan, "failed": reason}  # no "n": it is not known
        return {cid: out[cid] for cid in sorted(out)}

    def flower_result(self) -> Result:
        """The stage as Flower's `Result`: global arrays (if the algorithm has a global model) and metrics."""
        res = Result()
        weights = self.algo.global_model(self.result.state) if self.result else None
        if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
            res.arrays = ArrayRecord(weights)
        for row in self.history:
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


def build_server_app(settings: dict | None = None, sink: dict | None = None):
    """A ServerApp whose ``main`` runs a pflkit experiment (`pflkit.flower.serve.serve`).

    ``settings`` are merged over the run config (``flwr run --run-config`` / the
    ``[tool.flwr.app.config]`` table); ``sink["results"]`` receives the results dict
    (for in-process callers such as `pflkit.flower.simulation.run_flower`).
    """
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context) -> None:
        from pflkit.flower.serve import serve

        merged = {**dict(context.run_config), **(settings or {})}
        results = serve(grid, merged)
        if sink is not None:
            sink["results"] = results

    return app
