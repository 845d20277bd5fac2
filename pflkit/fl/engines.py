"""Engines: how `run_rounds` runs one round's client updates.

The round loop owns sampling, aggregation (in the fixed order of the sampled ids), the
history and the checkpoints; an engine only turns the round's sampled ids into their
``(update, client state)`` pairs, in that order. Engines pflkit has:

``sequential``
    one client after the other in the calling thread (torch's global RNG seeded from
    (seed, "client", id, round) before each, as pflkit always did).
``threads``
    a pool of worker threads on the CPU, each with one intra-op thread (torch releases the
    GIL inside its kernels, so the workers' kernels overlap). Each client draws from its own
    generators, so the numbers are the sequential engine's; at most one client update per
    worker is in flight.
``vectorized``
    the round's clients train together: each client's update runs in a thread of its own (kept
    across rounds) and their `local_sgd` calls are batched: every step is one vmapped forward over
    the clients' stacked weights and one backward pass (`pflkit.fl.vectorized`), the clients'
    batches gathered with one index op, a memory budget splitting the round into chunks;
    evaluation passes too (FT's fine-tuning, FedBABU's head). For algorithms that declare it
    (`Algorithm.vectorizable`); others run sequentially, with a log line saying why. It pays
    where the host's cost per step dominates (a GPU; on the CPU, models whose arithmetic is
    negligible: benchmarks/vectorized.py --workload host); convolutions on the CPU are
    compute-bound, so ``auto`` never picks it there.
``auto``
    ``vectorized`` on CUDA for an algorithm that declares it; ``threads`` on the CPU when more
    than one core is available; ``sequential`` otherwise, and whenever a round samples one client.
    It never picks ``vectorized`` on the CPU.

Another engine plugs in as one more entry of `RUNNERS` with the same signature, plus its rule
in `resolve_engine`.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from pflkit.config import ENGINES, ConfigError
from pflkit.fl.algorithm import Algorithm, Env, Update
from pflkit.fl.lockstep import plain_sgd, run_plain
from pflkit.fl.meet import run_together

log = logging.getLogger(__name__)

# (update, the client's new state, bytes of the message it received), one per sampled id, in order
ClientResult = tuple[Update, Any, int]


def check_engine(name: Any) -> str:
    """``name`` if it is an engine pflkit has, else a one-line `ConfigError` naming it."""
    if name not in ENGINES:
        raise ConfigError(f"engine={name!r}: expected one of {', '.join(ENGINES)}")
    return name


def available_cpus() -> int:
    """CPU cores this process may run on: ``$PFLKIT_CPUS`` when set (a batch worker's share of the
    cores, `pflkit.batch.reproduce`), else its affinity mask where the OS has one, else every core."""
    share = os.environ.get("PFLKIT_CPUS", "")
    if share.isdigit() and int(share) >= 1:
        return int(share)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def fallback_reason(requested: str, *, device_type: str, thread_unsafe: str = "", vectorizable: bool = False) -> str:
    """Why the engine ``requested`` (or what ``auto`` would pick) cannot run a stage; "" when nothing stops it."""
    if requested not in ("threads", "auto", "vectorized"):
        return ""
    if thread_unsafe:
        return f"its client update is not thread-safe: {thread_unsafe}"
    if requested == "vectorized" and not vectorizable:
        return "it does not declare a vectorizable client update (Algorithm.vectorizable: local SGD only)"
    if device_type != "cpu" and requested == "threads":
        return f"the threads engine runs on the CPU only (device type {device_type!r})"
    return ""


def resolve_engine(requested: str, *, device_type: str, cpus: int, clients: int, thread_unsafe: str = "",
                   vectorizable: bool = False) -> str:
    """The engine that runs one round (pure).

    Args:
        requested: one of `ENGINES` (checked).
        device_type: the run's device type (``"cpu"``, ``"cuda"``, ...).
        cpus: cores available to the process.
        clients: clients sampled this round.
        thread_unsafe: the algorithm's reason not to run in threads ("" if none).
        vectorizable: the algorithm declares a client update the vectorized engine can batch.
    """
    check_engine(requested)
    if requested == "sequential" or thread_unsafe or clients < 2:
        return "sequential"
    if requested == "vectorized" or (requested == "auto" and device_type == "cuda"):
        if vectorizable:
            return "vectorized"
        if requested == "vectorized":
            return "sequential"
    if device_type != "cpu":
        return "sequential"
    return "threads" if requested == "threads" or cpus > 1 else "sequential"


def thread_workers(cpus: int, clients: int) -> int:
    """Worker threads for a round: one per core, never more than the clients."""
    return max(1, min(cpus, clients))


def _client_update(algo: Algorithm, msg, client, client_state, cfg, env: Env):
    return algo.respond(msg, client, client_state, cfg, env)


def nbytes(obj: Any) -> int:
    """Bytes of all tensors / arrays inside a (nested) message or payload."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(nbytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


def run_sequential(algo: Algorithm, state, ids: list[int], fed, client_states: dict, cfg,
                   env: Env) -> list[ClientResult]:
    """One client after the other; torch's global RNG seeded per client (dropout-style draws).

    Each client's new state enters ``client_states`` as soon as its update returns.
    """
    out = []
    for cid in ids:
        msg = algo.send(state, cid, cfg, env)
        env.seed_torch("client", cid, env.round)
        upd, client_states[cid] = algo.respond(msg, fed.clients[cid], client_states.get(cid), cfg, env)
        out.append((upd, client_states[cid], nbytes(msg)))
    return out


@contextlib.contextmanager
def intra_op_threads(n: int):
    """torch's intra-op threads (process-wide) set to ``n`` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def worker_envs(env: Env, n: int) -> list[Env]:
    """``n`` views of ``env`` (same round, kernels...), each with its own module cache.

    Each worker thread trains in its own scratch modules; the caches are kept in ``env``'s
    cache across rounds (never more of them than the most workers a round has had).
    """
    caches: list[dict] = env.cached("engine-workers", list)
    caches.extend({} for _ in range(n - len(caches)))
    return [env.with_cache(cache) for cache in caches[:n]]


def run_threads(algo: Algorithm, state, ids: list[int], fed, client_states: dict, cfg, env: Env, *,
                workers: int) -> list[ClientResult]:
    """The round's clients in ``workers`` threads with one intra-op thread each; results in the order of ``ids``.

    The messages are made in the calling thread, in order, as a worker frees up (at most
    ``workers`` updates in flight). Each task runs in a copy of the caller's context
    (context variables). After a failure no new client starts, and the failure of the first
    failing client in ``ids`` order is raised, as the sequential engine would raise it.
    """
    free: queue.SimpleQueue[Env] = queue.SimpleQueue()
    for view in worker_envs(env, workers):
        free.put(view)
    tasks: list[tuple[Future, int]] = []
    with intra_op_threads(1), ThreadPoolExecutor(workers, thread_name_prefix="pflkit-client") as pool:
        for cid in ids:
            view = free.get()  # blocks until a worker is free
            if any(f.done() and f.exception() is not None for f, _ in tasks):
                free.put(view)
                break
            msg = algo.send(state, cid, cfg, env)
            run_in_context: Callable = contextvars.copy_context().run
            fut = pool.submit(run_in_context, _client_update, algo, msg, fed.clients[cid], client_states.get(cid),
                              cfg, view)
            fut.add_done_callback(lambda _, v=view: free.put(v))
            tasks.append((fut, nbytes(msg)))
    out = []
    for cid, (fut, down) in zip(ids, tasks):  # every task has finished: the pool shut down with wait=True
        upd, client_states[cid] = fut.result()  # the first failure in ids order surfaces here, as sequentially
        out.append((upd, client_states[cid], down))
    # the global RNG as the sequential engine leaves it after a client update that draws nothing from it
    env.seed_torch("client", ids[-1], env.round)
    return out


_NOTED: set[tuple[str, str]] = set()
_NOTED_LOCK = threading.Lock()


def _noter(algo: Algorithm) -> Callable[[str], None]:
    """A log line, once per process and reason, when the vectorized engine runs a local-SGD call alone."""
    def note(why: str) -> None:
        with _NOTED_LOCK:
            if (algo.name, why) in _NOTED:
                return
            _NOTED.add((algo.name, why))
        log.info("%s: the vectorized engine runs a local-SGD call on its own: %s", algo.name, why)
    return note


def _in_order(outcomes: list[tuple[Any, BaseException | None]]) -> list[Any]:
    """The results of ``outcomes`` (``(result, error)`` per client, in order); the first failure is raised."""
    out = []
    for result, error in outcomes:
        if error is not None:
            raise error
        out.append(result)
    return out


def together_limit() -> int:
    """Clients the vectorized engine trains or evaluates at once: ``$PFLKIT_VECTOR_CLIENTS``, else 128
    (a round of more clients runs in chunks of that many; each client in flight holds its own
    scratch model and its share of the stacked weights and activations)."""
    value = os.environ.get("PFLKIT_VECTOR_CLIENTS", "")
    return int(value) if value.isdigit() and int(value) >= 1 else 128


def _chunks(ids: list[int]) -> list[list[int]]:
    size = together_limit()
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def run_vectorized(algo: Algorithm, state, ids: list[int], fed, client_states: dict, cfg,
                   env: Env) -> list[ClientResult]:
    """The round's clients together, their local SGD batched (`pflkit.fl.vectorized`); results in the
    order of ``ids``. A client update that is plain local SGD (`pflkit.fl.lockstep.plain_sgd`: FedAvg's)
    is planned, trained and answered in this thread (`pflkit.fl.lockstep.run_plain`); any other runs in
    a thread of its own whose `local_sgd` calls meet the others' (`pflkit.fl.meet`).

    The messages are made in the calling thread, in order; each thread has its own scratch
    modules (`worker_envs`). A client's new state enters ``client_states`` once it and every
    client before it in ``ids`` finished, so a failure raises as the sequential engine would.
    """
    out = []
    direct = plain_sgd(algo, cfg)
    for chunk in _chunks(list(ids)):
        msgs = [algo.send(state, cid, cfg, env) for cid in chunk]
        if direct:
            results = run_plain(algo, msgs, chunk, fed, client_states, cfg, env, _noter(algo))
            out.extend((upd, new, nbytes(msg)) for msg, (upd, new) in zip(msgs, results))
            continue
        calls = [partial(_client_update, algo, msg, fed.clients[cid], client_states.get(cid), cfg, view)
                 for cid, msg, view in zip(chunk, msgs, worker_envs(env, len(chunk)))]
        for cid, msg, (result, error) in zip(chunk, msgs, run_together(calls, _noter(algo))):
            if error is not None:
                raise error
            upd, client_states[cid] = result
            out.append((upd, client_states[cid], nbytes(msg)))
    # the global RNG as the sequential engine leaves it after a client update that draws nothing from it
    env.seed_torch("client", ids[-1], env.round)
    return out


def evaluate_vectorized(algo: Algorithm, state, ids: list[int], fed, client_states: dict, cfg, env: Env,
                        split: str) -> tuple[dict[int, dict], int]:
    """(each client's metrics on ``split``, bytes of the views sent): the clients in threads whose local
    SGD (fine-tuning before the test) is batched, from their evaluation views (`Algorithm.eval_view`,
    made in the calling thread, in order)."""
    metrics, down = {}, 0
    for chunk in _chunks(list(ids)):
        views = [algo.eval_view(state, cid, cfg, env) for cid in chunk]
        calls = [partial(algo.evaluate_view, view, fed.clients[cid], client_states.get(cid), cfg, wenv, split)
                 for cid, view, wenv in zip(chunk, views, worker_envs(env, len(chunk)))]
        metrics.update(zip(chunk, _in_order(run_together(calls, _noter(algo)))))
        down += sum(nbytes(v) for v in views)
    env.seed_torch("eval", ids[-1], split)  # the global RNG as the sequential pass leaves it
    return metrics, down


def round_engine(algo: Algorithm, env: Env, clients: int, cpus: int) -> str:
    """`resolve_engine` for ``algo`` under ``env`` with ``clients`` clients."""
    return resolve_engine(env.engine, device_type=torch.device(env.device).type, cpus=cpus, clients=clients,
                          thread_unsafe=algo.thread_unsafe, vectorizable=algo.vectorizable)


RUNNERS: dict[str, Callable[..., list[ClientResult]]] = {"sequential": run_sequential, "threads": run_threads,
                                                         "vectorized": run_vectorized}


def train_clients(algo: Algorithm, state, ids: list[int], fed, client_states: dict, cfg, env: Env,
                  cpus: int) -> tuple[list[ClientResult], str]:
    """The round's client updates with ``env.engine`` resolved for this round: (results, engine used).

    Client ``i``'s new state enters ``client_states`` once it and every client before it in
    ``ids`` finished, so a failure leaves the states (and raises the error) the sequential
    engine would.
    """
    used = round_engine(algo, env, len(ids), cpus)
    if used == "threads":
        return run_threads(algo, state, ids, fed, client_states, cfg, env, workers=thread_workers(cpus, len(ids))), used
    return RUNNERS[used](algo, state, ids, fed, client_states, cfg, env), used
