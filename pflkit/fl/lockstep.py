"""A vectorized round without a thread per client: for client updates that are plain local SGD.

The vectorized engine's general path (`pflkit.fl.meet`) runs each client's ``client_update`` in a thread
of its own and batches the threads' `pflkit.fl.train.local_sgd` calls at a rendezvous: any algorithm code
runs around the calls, at the price of the threads' Python and their hand-offs of the interpreter lock
(about a quarter of a round of 50 small clients, `benchmarks/vectorized.py --workload host`).

An algorithm whose client update is FedAvg's (`Algorithm.plain_sgd`: load the message's weights into
the model, `pflkit.fl.train.round_sgd` with the round's settings, send the trained state back, the
client state unchanged) needs none of that: here the calling thread plans every client's training
(`round_sgd` itself builds each plan and batch stream, its `local_sgd` handing them over through
`pflkit.fl.train.SGD_OFFLOAD`), runs the plans in lockstep (`pflkit.fl.vectorized`) straight from the
message's weights, and builds each client's `Update` from the trained stacks: the payload, metrics,
sample count and client state that the sequential ``client_update`` gives.

The algorithms whose update does more than that (Local and FedPer keep a model per client, Ditto trains
twice, FedBABU, LG-FedAvg, FedSelect and its variants, pFedHN, FT, LotteryFL pick parameters, masks or
stages between calls) keep the thread path, as does FedAvg under the broadcast protocol (a client that
does not report trains nothing).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from pflkit import kernels
from pflkit.fl.algorithm import Algorithm, Env, Update
from pflkit.fl.sampling import broadcasting
from pflkit.fl.train import SGD_OFFLOAD, round_sgd, set_state
from pflkit.fl.batchable import memory_budget, signature, why_not
from pflkit.fl.vectorized import Request, run_members

__all__ = ["plain_sgd", "run_plain"]


def plain_sgd(algo: Algorithm, cfg) -> bool:
    """Whether ``algo``'s client update is FedAvg's plain local SGD (`Algorithm.plain_sgd`, still its
    ``client_update``: a variant that replaces it is not) under the sampled protocol."""
    return algo.plain_sgd is not None and algo.plain_sgd is algo.client_update and not broadcasting(cfg)


def _plans(work: list[tuple], cfg, env: Env) -> list[Request]:
    """The request of each ``(model, client)``'s round of local SGD: what `round_sgd` would train, with the
    same plan and batch stream (its `local_sgd` hands them over instead of training)."""
    got: list[Request] = []

    def take(plan, batches):
        got.append(Request(plan, batches, keep=True))
        return {}, batches  # stats not None: local_sgd returns without training
    token = SGD_OFFLOAD.set(take)
    try:
        for model, client in work:
            round_sgd(model, client, cfg, env)
    finally:
        SGD_OFFLOAD.reset(token)
    return got


def run_plain(algo: Algorithm, msgs: list, ids: list[int], fed, client_states: dict, cfg, env: Env,
              note: Callable[[str], None]) -> list[tuple[Update, Any]]:
    """Each client's ``(Update, client state)`` of a round of ``algo`` (`plain_sgd`), in the order of ``ids``,
    its ``msgs`` already made; trained together in this thread. The first failure in ``ids`` order is
    raised after the clients before it have their states, as the sequential engine would.

    The clients sharing one message (FedAvg's global weights: all of them) share one model, loaded once,
    from which their group's stacks are built. Plans that cannot be batched (`why_not`: dropout, hooks) or
    whose group could not start (an op without a batching rule) run here one by one with the ordinary
    loop, the global random generator seeded per client as the sequential engine seeds it.
    """
    models: dict[int, torch.nn.Module] = {}
    for msg in msgs:
        if id(msg) not in models:  # a model per distinct message: scratch modules of their own
            view = env.with_cache(env.cached(("plain-sgd", len(models)), dict))
            models[id(msg)] = set_state(view.scratch_model(), msg)
    reqs = _plans([(models[id(msg)], fed.clients[cid]) for cid, msg in zip(ids, msgs)], cfg, env)
    why = {k: why_not(r.plan) for k, r in {id(r.plan.model): r for r in reqs}.items()}  # once per model
    sig = {k: signature(r.plan) for k, r in {id(r.plan.model): r for r in reqs}.items() if not why[k]}
    groups: dict[tuple, list[Request]] = {}
    for r in reqs:
        if why[id(r.plan.model)]:
            note(why[id(r.plan.model)])
        else:
            groups.setdefault(sig[id(r.plan.model)], []).append(r)
    with kernels.use_backend("reference"):  # custom ops: their vmappable pure-PyTorch twins
        for members in groups.values():
            run_members(members, note, memory_budget(next(members[0].plan.model.parameters()).device))
    out = []
    for cid, msg, r in zip(ids, msgs, reqs):
        client = fed.clients[cid]
        if r.error is not None:
            raise r.error
        if r.stats is None:  # not batched: the sequential engine's update, here
            env.seed_torch("client", cid, env.round)
            upd, client_states[cid] = algo.respond(msg, client, client_states.get(cid), cfg, env)
        else:
            upd = Update(client.id, client.num("train"), r.state, {"loss": r.stats["loss"]})
            client_states[cid] = client_states.get(cid)
        out.append((upd, client_states[cid]))
    return out
