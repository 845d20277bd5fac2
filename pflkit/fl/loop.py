"""The one round loop: sampling, client updates, aggregation, evaluation, checkpoints.

Every algorithm in pflkit is trained by `run_rounds`. The loop owns what all
algorithms share (which clients take part, how often to validate, which state to
keep, when to checkpoint, the progress bar, the per-round history) and nothing
an algorithm decides (what travels, how the server combines it).

Where the clients run is the transport's business (`pflkit.fl.transport`): in this
process (`LocalTransport`, the default) or on Flower nodes
(`pflkit.flower.server_app.PflkitStrategy`); the loop is the same for both, so a stage
gives the same history and results whichever carries its messages.

Determinism: client sampling (`pflkit.fl.sampling`) draws from (seed, round) and each client update from
(seed, client, round), so a run resumed from a checkpoint ends with exactly the
numbers of an uninterrupted one, and the engine that runs a round's client updates
(``env.engine``: one after the other, or in a pool of CPU threads; `pflkit.fl.engines`)
does not change them: the loop aggregates the updates in the order of the sampled ids.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pflkit.config import to_dict
from pflkit.fl.algorithm import Algorithm, Env, FLConfig, Update, check_config
from pflkit.fl.engines import check_engine, fallback_reason
from pflkit.fl.federation import Federation
from pflkit.fl.sampling import SamplingRule, eval_clients, sample_clients
from pflkit.fl.train import Diverged
from pflkit.fl.transport import Evaluation, LocalTransport, RoundWork, Transport
from pflkit.io import load_torch, progress_bar, save_torch
from pflkit.kernels import use_backend

log = logging.getLogger(__name__)


def summarize(per_client: dict[int, dict]) -> dict[str, float]:
    """Mean over clients of each client's accuracy and loss (the papers' personalized accuracy)."""
    accs = [m["acc"] for m in per_client.values() if m.get("n", 1) > 0]
    losses = [m["loss"] for m in per_client.values() if m.get("n", 1) > 0]
    return {"acc": float(np.mean(accs)) if accs else math.nan, "loss": float(np.mean(losses)) if losses else math.nan}


def nonfinite_paths(obj: Any, path: str = "state") -> list[str]:
    """Where a (nested) state holds NaN or infinite floating-point values, e.g. ``state.model.bn1.running_var``."""
    if isinstance(obj, torch.Tensor):
        return [path] if obj.is_floating_point() and not bool(torch.isfinite(obj).all()) else []
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in nonfinite_paths(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in nonfinite_paths(v, f"{path}[{i}]")]
    if hasattr(obj, "__dataclass_fields__"):
        return [p for f in obj.__dataclass_fields__ for p in nonfinite_paths(getattr(obj, f), f"{path}.{f}")]
    return []


def check_finite(obj: Any, what: str, when: str) -> None:
    """Raise `Diverged` naming the first non-finite tensors of ``obj`` (weights, buffers, statistics)."""
    bad = nonfinite_paths(obj, what)
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise Diverged(f"non-finite values in {', '.join(bad[:3])}{more} {when}")


def missing_clients(per_client: dict[int, dict]) -> list[dict]:
    """Clients without a finite test accuracy, each with the reason (a failed evaluation's ``"failed"``
    text, as a transport such as Flower records it; no test samples; NaN)."""
    out = []
    for cid in sorted(per_client):
        m = per_client[cid]
        if "failed" in m:
            out.append({"client": int(cid), "reason": m["failed"]})
        elif m.get("n", 1) == 0:
            out.append({"client": int(cid), "reason": "no test samples"})
        elif m.get("acc") is None or not math.isfinite(float(m["acc"])):
            out.append({"client": int(cid), "reason": f"test accuracy is {m.get('acc')}"})
    return out


def _score(cfg: FLConfig, val: dict | None, updates: list[Update]) -> float | None:
    """Higher is better; None when there is nothing to compare (no pass, or a NaN score).

    ``select="update_val_loss"``: minus the round's clients' validation loss, weighted by their sample counts
    (pflkit's default); ``"update_val_loss_mean"``: unweighted, as the authors keep FedL2P's lambda
    (github.com/royson/fedl2p, ``src/apps/fedl2p_classification_app.py`` lines 270-273: ``np.mean`` of the
    sampled clients' ``fed_query_loss``, the lowest mean kept). docs/fidelity.md gives the measured effect."""
    if cfg.select in ("update_val_loss", "update_val_loss_mean"):
        vals = [(u.metrics["val_loss"], u.num_samples) for u in updates if "val_loss" in u.metrics]
        if not vals:
            return None
        if cfg.select == "update_val_loss_mean":
            vals = [(v, 1) for v, _ in vals]
        w = sum(n for _, n in vals)
        score = -sum(v * n for v, n in vals) / w
        return score if math.isfinite(score) else None
    if val is None:
        return None
    score = val["acc"] if cfg.select == "val_acc" else -val["loss"]
    return score if math.isfinite(score) else None


@dataclass
class StageResult:
    """What a training stage leaves: final (or best) state, per-client test metrics, history.

    ``status``: ``"ok"``; ``"diverged"`` (a non-finite loss, weight or buffer); ``"incomplete"`` (some
    client has no test accuracy: ``missing`` lists ``{"client", "reason"}``). ``engine``: the
    engines that ran its rounds' client updates (``"threads"``, ``"sequential"``, both joined
    by ``+`` when rounds differed; without rounds, the engine of its test pass, e.g. FT's fine-tuning).
    """

    status: str
    state: Any
    client_states: dict
    history: list[dict]
    per_client: dict[int, dict] = field(default_factory=dict)
    best_round: int | None = None
    seconds: float = 0.0
    error: str = ""
    missing: list[dict] = field(default_factory=list)
    engine: str = ""

    def set_test(self, per_client: dict[int, dict]) -> None:
        """Record the test pass; a client without a finite accuracy makes the stage ``incomplete``."""
        self.per_client, self.missing = per_client, missing_clients(per_client)
        if self.missing:
            self.status, self.error = "incomplete", f"{len(self.missing)} client(s) without a test accuracy"

    @property
    def summary(self) -> dict[str, float]:
        return summarize(self.per_client) if self.per_client else {"acc": math.nan, "loss": math.nan}


def _round_row(t: int, ids: list[int], work: RoundWork) -> dict:
    """The history row of round ``t + 1`` from its client work (before validation)."""
    updates = work.updates
    n = sum(u.num_samples for u in updates) or 1
    losses = [u.metrics["loss"] * u.num_samples for u in updates if "loss" in u.metrics]
    row = {"round": t + 1, "clients": len(ids), "train_loss": sum(losses) / n if losses else None,
           "bytes_down": work.down, "bytes_up": work.up, "completed": len(updates), "failed": sorted(work.failures),
           "failures": {str(c): r for c, r in sorted(work.failures.items())}}
    if row["train_loss"] is not None and not math.isfinite(row["train_loss"]):
        raise Diverged(f"non-finite training loss in round {t + 1}")
    keys = {k for u in updates for k in u.metrics} - {"loss"}
    row.update({f"client_{k}": float(np.mean([u.metrics[k] for u in updates if k in u.metrics])) for k in keys})
    return row


def _validation(ev: Evaluation) -> tuple[dict, dict]:
    """(the pass's mean metrics, its entries of the history row)."""
    val = summarize(ev.per_client)
    row = {"val_acc": val["acc"], "val_loss": val["loss"], "bytes_eval": ev.down}
    if ev.failures:
        row["val_failed"] = sorted(ev.failures)
        row["val_failures"] = {str(c): r for c, r in sorted(ev.failures.items())}
    return val, row


def _test_metrics(ev: Evaluation) -> dict[int, dict]:
    """Every client's test metrics; a client whose evaluation failed gets NaN and the reason."""
    out = dict(ev.per_client)
    for cid, reason in ev.failures.items():
        out[cid] = {"acc": math.nan, "loss": math.nan, "failed": reason}  # no "n": it is not known
    return {cid: out[cid] for cid in sorted(out)}


def run_rounds(algo: Algorithm, cfg: FLConfig, fed: Federation, model: torch.nn.Module, env: Env, *,
               checkpoint: str | os.PathLike | None = None, resume: bool = False, test: bool = True,
               desc: str | None = None, transport: Transport | None = None) -> StageResult:
    """Train ``algo`` for ``cfg.rounds`` rounds on ``fed``, then test every client.

    Args:
        algo: the algorithm's phase bundle.
        cfg: its config (validated on construction).
        fed: the federation.
        model: the initial global model (fresh, or pretrained when ``algo.needs_pretrained``).
        env: run context (model factory, device, seed, ``engine`` for the client updates).
        checkpoint: file to write atomically every ``cfg.checkpoint_every`` rounds.
        resume: continue from ``checkpoint`` if it exists.
        test: evaluate every client's test split at the end.
        desc: progress-bar label (None: no bar).
        transport: how the messages reach the clients (`pflkit.fl.transport`); default: this process.

    Returns:
        A `StageResult`; ``status`` is ``"diverged"`` when a loss, a weight or a buffer of the
        server state became non-finite (checked after every aggregation and, with the client
        states, at the end), ``"incomplete"`` when a client has no finite test accuracy.
    """
    check_config(algo, cfg)
    check_engine(env.engine)
    transport = transport if transport is not None else LocalTransport()
    with use_backend(env.kernels) if env.kernels else contextlib.nullcontext():  # the run's kernels, this stage only
        return _stage(algo, cfg, fed, model, env, checkpoint, resume, test, desc, transport)


def _stage(algo: Algorithm, cfg: FLConfig, fed: Federation, model: torch.nn.Module, env: Env, checkpoint,
           resume: bool, test: bool, desc: str | None, transport: Transport) -> StageResult:
    """`run_rounds` once its arguments are checked, under the run's kernel backend."""
    used = set()
    why = fallback_reason(env.engine, device_type=torch.device(env.device).type, thread_unsafe=algo.thread_unsafe,
                          vectorizable=algo.vectorizable)
    if why and cfg.rounds > 0 and transport.name == "local":
        log.info("%s: engine %s runs its clients sequentially: %s", algo.name, env.engine, why)
    t0 = time.perf_counter()
    transport.open(algo, cfg, fed, env)
    state = algo.start(model, fed, cfg, env)
    history: list[dict] = []
    best: tuple[float, int, Any] | None = None
    start, earlier = 0, 0.0
    if resume and checkpoint is not None and os.path.exists(checkpoint):
        ck = load_torch(checkpoint)
        start, state, history, best = ck["round"], ck["state"], ck["history"], ck["best"]
        transport.restore(ck["transport"])
        earlier = float(ck.get("seconds", 0.0))  # time spent before the stop counts in the stage's seconds
        log.info("resumed %s at round %d from %s", algo.name, start, checkpoint)
    t0 -= earlier
    val_ids = eval_clients(fed.seen_ids, cfg, env)
    bar = progress_bar(range(start, cfg.rounds), desc=desc, initial=start, total=cfg.rounds, disable=desc is None or None)
    try:
        for t in bar:
            now = env.at_round(t)  # the round's context: phases read the round, none can change it
            tr = time.perf_counter()
            ids = sample_clients(fed.seen_ids, SamplingRule.of(cfg), env, t)
            work = transport.train(state, ids, now)
            used.add(work.engine)
            if work.updates:
                state = algo.aggregate(state, work.updates, cfg, now)
                check_finite(state, "state", f"after the aggregation of round {t + 1}")
            else:
                log.warning("%s round %d: no client answered; the state is unchanged", algo.name, t + 1)
            row, val = _round_row(t, ids, work), None
            if cfg.eval_every and ((t + 1) % cfg.eval_every == 0 or t + 1 == cfg.rounds):
                val, entries = _validation(transport.evaluate(state, val_ids, "val", now))
                row.update(entries)
            score = _score(cfg, val, work.updates)
            if cfg.keep_best and score is not None and (best is None or score > best[0]):  # never NaN
                best = (score, t + 1, copy.deepcopy(state))
                transport.mark_best(t + 1)
            row["seconds"] = time.perf_counter() - tr
            history.append(row)
            if desc is not None:
                bar.set_postfix({k: f"{row[k]:.3f}" for k in ("train_loss", "val_acc") if row.get(k) is not None})
            log.info("%s round %d: %s", algo.name, t + 1, {k: v for k, v in row.items() if k != "round"})
            if checkpoint is not None and ((t + 1) % cfg.checkpoint_every == 0 or t + 1 == cfg.rounds):
                transport.saved(t + 1)
                save_torch(checkpoint, {"round": t + 1, "state": state, "transport": transport.snapshot(),
                                        "history": history, "best": best, "algorithm": algo.name,
                                        "config": to_dict(cfg), "seconds": time.perf_counter() - t0})
    except Diverged as e:
        log.warning("%s diverged: %s", algo.name, e)
        return _diverged(e, state, best if cfg.keep_best else None, transport, history, time.perf_counter() - t0,
                         _engines(used))
    finally:
        bar.close()
    at_best = cfg.keep_best and best is not None
    best_round = best[1] if at_best else None
    if at_best:
        state = best[2]
    result = StageResult("ok", state, transport.client_states(at_best), history, best_round=best_round,
                         engine=_engines(used))
    try:
        check_finite(result.client_states, "client_states", "at the end of the stage")
        if test:
            last = env.at_round(max(cfg.rounds - 1, 0))
            tested = transport.evaluate(state, range(fed.num_clients), "test", last, at_best)
            result.set_test(_test_metrics(tested))
            result.engine = result.engine or tested.engine
    except Diverged as e:
        result.status, result.error = "diverged", str(e)
    result.seconds = time.perf_counter() - t0
    return result


def _engines(used: set) -> str:
    return "+".join(sorted(u for u in used if u))


def _diverged(error: Diverged, state, best, transport: Transport, history: list[dict], seconds: float,
              engine: str) -> StageResult:
    """The result of a stage that diverged in its rounds: keep-best's state and client states when it had
    chosen a round (``best_round``), else the last state reached; ``diverged`` either way, no client tested."""
    kept = best is not None
    return StageResult("diverged", best[2] if kept else state, transport.client_states(kept), history,
                       best_round=best[1] if kept else None, seconds=seconds, error=str(error), engine=engine)
