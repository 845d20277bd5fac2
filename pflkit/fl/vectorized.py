"""Many clients' local SGD as one computation: ``torch.func.vmap`` over their stacked weights.

The vectorized engine (`pflkit.fl.engines.run_vectorized`) runs each sampled client's
``client_update`` in a thread of its own, as the threads engine does, but the threads do not
train: every `pflkit.fl.train.local_sgd` call hands its `SGDPlan` and its batch stream to a
`Rendezvous` (through `pflkit.fl.train.SGD_OFFLOAD`) and waits. When every client thread is
waiting or finished, the calling thread runs the waiting plans together (`run_plans`) and
wakes the threads, which go on with their update (build the message, train again, ...).

Plans that agree on the architecture, the trainable tensors and the SGD settings form a group
(`signature`). A group's parameters, buffers (each client's BatchNorm statistics) and momentum
buffers are stacked along a leading client axis, and every step is one
``vmap(grad(loss))`` over the clients, followed by `torch.optim.SGD`'s arithmetic on the stacks.

Lockstep: at step ``s`` every client of the group draws its ``s``-th batch from its own stream,
made by the same generator calls as in the sequential engine, so the clients see the batches
they would see one after another. A client whose stream has ended is masked out (its tensors
stay as they are) and the group goes on with the others; clients whose ``s``-th batch has
another size (the short last batch of an epoch) form a subgroup of their own at that step,
because padding a batch would change BatchNorm's batch statistics.

Plans that cannot be batched (`why_not`: a custom criterion, a free-form extra loss, gradient
hooks, dropout, ...) run in their own thread with the ordinary loop, and say why once.
Custom ops run their pure-PyTorch reference inside the vmap (`pflkit.kernels`). The numbers
equal the sequential engine's to float rounding (tests/fl/test_vectorized.py) as training amplifies
it: a deep BatchNorm net moves as far from a one-ulp change of its start (ResNet-18 FedAvg, 2-3
rounds of 5 steps: 0.34-0.46 at most over the server state), and the vectorized run ends about as far.
"""
from __future__ import annotations

import contextvars
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from pflkit import kernels
from pflkit.errors import Diverged
from pflkit.fl.train import SGD_OFFLOAD, Batch, SGDPlan, check_finite, proximal_penalty, sgd_step

log = logging.getLogger(__name__)

__all__ = ["why_not", "signature", "run_plans", "Rendezvous", "run_together"]


# ----------------------------------------------------------------------------- what can be batched

def _stray_tensor(module: nn.Module) -> str:
    """The name of a tensor a module holds outside its parameters and buffers ("" if none): such a
    tensor would be shared by every client of a group, since a group runs one module's code."""
    return next((k for k, v in vars(module).items() if isinstance(v, torch.Tensor)), "")


def why_not(plan: SGDPlan) -> str:
    """Why ``plan`` cannot run in a vmapped group ("" when it can)."""
    if not plan.params:
        return "no trainable parameters"
    if plan.criterion is not None:
        return "a custom training criterion"
    if plan.extra_loss is not None:
        return "a free-form extra loss term"
    named = {id(p) for p in plan.model.parameters()}
    if any(id(p) not in named for p in plan.params):
        return "it trains parameters outside its model"
    if any(p._backward_hooks for p in plan.model.parameters()):
        return "gradient hooks on its parameters"
    for name, m in plan.model.named_modules():
        where = name or "the model"
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return f"hooks on {where}"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training:
            return f"dropout in {where} draws from torch's global random stream"
        stray = _stray_tensor(m)
        if stray:
            return f"{where} holds a tensor attribute {stray!r}"
    return ""


def signature(plan: SGDPlan) -> tuple:
    """What plans must share to run in one group: the module (its code and settings, via its repr and
    training flags), the shape, dtype and device of every tensor, the trainable names, the SGD settings."""
    model = plan.model
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    return (type(model), repr(model), tuple(m.training for m in model.modules()),
            tuple((n, tuple(t.shape), t.dtype, str(t.device)) for n, t in tensors),
            tuple(names[id(p)] for p in plan.params), plan.lr, plan.momentum, plan.weight_decay,
            plan.max_grad_norm, None if plan.prox is None else plan.prox[0], plan.loss_decay)


# ----------------------------------------------------------------------------- one group in lockstep

@dataclass
class Request:
    """One offloaded `local_sgd` call: its plan and batches in, its stats (or error) out."""

    plan: SGDPlan
    batches: Iterator[Batch]
    stats: dict | None = None
    error: BaseException | None = None
    done: bool = False


class _Fallback(Exception):
    """A group's stacking or first vmapped step failed: nothing has moved yet. ``memory``: it ran out of
    memory (then halves of the group are tried)."""

    def __init__(self, why: str, memory: bool):
        super().__init__(why)
        self.memory = memory


def _fallback(e: Exception) -> _Fallback:
    memory = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
    return _Fallback(f"{type(e).__name__}: {' '.join(str(e).split())[:160]}", memory)


def _loss_fn(template: nn.Module, names: list[str], lam: float | None, decay: float) -> Callable:
    """``(trainable, frozen, buffers, x, y, anchor) -> (loss, loss)`` of one client, for ``grad``: the
    terms of `pflkit.fl.train.run_sgd`, in its order."""
    def loss(trainable, frozen, buffers, x, y, anchor):
        weights = {**trainable, **frozen}
        value = F.cross_entropy(functional_call(template, {**weights, **buffers}, (x,)), y)
        if lam is not None:
            value = value + proximal_penalty(((n, weights[n]) for n in names), anchor, lam)
        if decay > 0:
            value = value + 0.5 * decay * sum(p.pow(2).sum() for p in trainable.values())
        return value, value.detach()
    return loss


class _Group:
    """The stacked state of a group of plans (client axis first) and its SGD steps."""

    def __init__(self, plans: list[SGDPlan]):
        first = plans[0]
        self.plans, self.template = plans, first.model
        self.names = [n for n, _ in first.model.named_parameters()]
        ids = {id(p): n for n, p in first.model.named_parameters()}
        self.train = [ids[id(p)] for p in first.params]
        self.frozen = [n for n in self.names if n not in set(self.train)]
        self.bnames = [n for n, _ in first.model.named_buffers()]
        with torch.no_grad():
            self.P = {n: torch.stack([dict(p.model.named_parameters())[n].detach() for p in plans]) for n in self.names}
            self.B = {n: torch.stack([dict(p.model.named_buffers())[n] for p in plans]) for n in self.bnames}
            self.A = None if first.prox is None else {
                n: torch.stack([p.prox[1][n].to(self.P[n].device, self.P[n].dtype) for p in plans]) for n in self.names}
            masked = {n for p in plans for n, m in zip(self.train, p.grad_masks or ()) if m is not None}
            self.G = {n: torch.stack([_mask_of(p, n, self.train, self.P[n][0]) for p in plans]) for n in masked}
        self.M = {n: torch.zeros_like(self.P[n]) for n in self.train} if first.momentum else {}
        device = self.P[self.names[0]].device
        self.total = torch.zeros(len(plans), dtype=torch.float64, device=device)
        self.seen, self.taken = [0] * len(plans), [0] * len(plans)
        lam = None if first.prox is None else first.prox[0]
        self.step_fn = vmap(grad(_loss_fn(self.template, self.names, lam, first.loss_decay), has_aux=True),
                            in_dims=(0, 0, 0, 0, 0, None if self.A is None else 0))

    def step(self, idx: list[int], x: torch.Tensor, y: torch.Tensor) -> None:
        """One SGD step of the clients ``idx`` on their stacked batches ``x``, ``y`` (client axis first)."""
        plan = self.plans[0]
        full = idx == list(range(len(self.plans)))
        sel = None if full else torch.tensor(idx, device=x.device)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t if full else t.index_select(0, sel)

        trainable = {n: take(self.P[n]) for n in self.train}
        buffers = {n: take(self.B[n]) for n in self.bnames}  # BatchNorm updates these in place
        anchor = None if self.A is None else {n: take(self.A[n]) for n in self.names}
        with torch.enable_grad():
            grads, losses = self.step_fn(trainable, {n: take(self.P[n]) for n in self.frozen}, buffers, x, y, anchor)
        with torch.no_grad():
            if not full:
                for n in self.bnames:
                    self.B[n].index_copy_(0, sel, buffers[n])
            grads = {n: grads[n] * take(self.G[n]) if n in self.G else grads[n] for n in self.train}
            if plan.max_grad_norm > 0:
                grads = _clipped(grads, self.train, plan.max_grad_norm)
            # SGD's step on the stacks, in place (on copies for a subgroup, written back); elementwise, so
            # per client; the zero momentum buffers make each client's first buffer its gradient, as SGD's copy
            weights = [trainable[n] for n in self.train]
            bufs = sgd_step(weights, [grads[n] for n in self.train],
                            [take(self.M[n]) for n in self.train] if plan.momentum else [None] * len(self.train),
                            lr=plan.lr, momentum=plan.momentum, weight_decay=plan.weight_decay)
            for n, w, buf in zip(self.train, weights, bufs):
                if not full:
                    self.P[n].index_copy_(0, sel, w)
                    if buf is not None:
                        self.M[n].index_copy_(0, sel, buf)
            self.total.index_add_(0, torch.tensor(idx, device=self.total.device), losses.double() * y.shape[1])
        for i in idx:
            self.seen[i] += y.shape[1]
            self.taken[i] += 1

    def write_back(self) -> None:
        """Each client's trained tensors into its own model (what the ordinary loop leaves there)."""
        with torch.no_grad():
            for i, plan in enumerate(self.plans):
                params, buffers = dict(plan.model.named_parameters()), dict(plan.model.named_buffers())
                for n in self.names:
                    params[n].copy_(self.P[n][i])
                for n in self.bnames:
                    buffers[n].copy_(self.B[n][i])

    def stats(self, i: int) -> dict:
        """`local_sgd`'s return value for client ``i`` (`Diverged` on a non-finite loss)."""
        loss = check_finite(float(self.total[i]), self.plans[i].where) / max(self.seen[i], 1)
        return {"loss": loss, "steps": self.taken[i], "samples": self.seen[i]}


def _mask_of(plan: SGDPlan, name: str, train: list[str], like: torch.Tensor) -> torch.Tensor:
    """``plan``'s gradient mask of trainable tensor ``name`` (ones where it has none)."""
    masks = dict(zip(train, plan.grad_masks or ()))
    mask = masks.get(name)
    return torch.ones_like(like) if mask is None else mask.to(like.device, like.dtype)


def _clipped(grads: dict, names: list[str], max_norm: float) -> dict:
    """`torch.nn.utils.clip_grad_norm_` per client: each client's gradients scaled by
    ``min(1, max_norm / (||g||_2 + 1e-6))``, ``||g||`` over all its trainable tensors."""
    norms = torch.stack([torch.linalg.vector_norm(grads[n].flatten(1), dim=1) for n in names], dim=1)
    coef = (max_norm / (torch.linalg.vector_norm(norms, dim=1) + 1e-6)).clamp(max=1.0)
    return {n: grads[n] * coef.view(-1, *[1] * (grads[n].dim() - 1)) for n in names}


def _by_size(live: list[int], got: dict[int, Batch]) -> list[list[int]]:
    """The live clients grouped by the shapes of their current batch (first-seen order)."""
    groups: dict[tuple, list[int]] = {}
    for i in live:
        groups.setdefault((tuple(got[i][0].shape), tuple(got[i][1].shape)), []).append(i)
    return list(groups.values())


def _draw(reqs: list[Request], live: list[int]) -> dict[int, Batch]:
    """The next batch of each live client; a stream that fails sets its request's error."""
    got = {}
    for i in live:
        try:
            got[i] = next(reqs[i].batches)
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 - the client's own failure, raised in its thread
            reqs[i].error = e
    return got


def _run_group(reqs: list[Request]) -> None:
    """Train one group of requests in lockstep and fill in their stats or errors."""
    try:
        group = _Group([r.plan for r in reqs])
    except Exception as e:
        raise _fallback(e) from e
    live, first = list(range(len(reqs))), True
    while live:
        got = _draw(reqs, live)
        live = [i for i in live if i in got]
        for idx in _by_size(live, got):
            x = torch.stack([got[i][0] for i in idx])
            y = torch.stack([got[i][1] for i in idx])
            try:
                group.step(idx, x, y)
            except Exception as e:
                if not first:
                    raise
                for i in live:  # nothing has moved yet: each plan starts over with the batch it drew
                    reqs[i].batches = itertools.chain([got[i]], reqs[i].batches)
                raise _fallback(e) from e
            first = False
    group.write_back()
    for i, r in enumerate(reqs):
        if r.error is None:
            try:
                r.stats = group.stats(i)
            except Diverged as e:
                r.error = e


def run_plans(reqs: list[Request], note: Callable[[str], None]) -> None:
    """Run every request: the groups of equal `signature` one after another, each in lockstep.

    A group too large for the device's memory is split in halves, until it fits. A group whose
    first step fails otherwise (an op without a batching rule, say) leaves its requests without
    stats: their threads run them with the ordinary loop; ``note`` hears why.
    """
    groups: dict[tuple, list[Request]] = {}
    for r in reqs:
        groups.setdefault(signature(r.plan), []).append(r)
    with kernels.use_backend("reference"):  # custom ops: their vmappable pure-PyTorch twins
        for members in groups.values():
            _run_members(members, note)


def _run_members(members: list[Request], note: Callable[[str], None]) -> None:
    try:
        _run_group(members)
    except _Fallback as e:
        if not (e.memory and len(members) > 1):
            note(f"the vmapped step failed ({e})")
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = len(members) // 2
        note(f"{len(members)} clients at once ran out of memory; they run in halves")
        _run_members(members[:half], note)
        _run_members(members[half:], note)
    except Exception as e:  # noqa: BLE001 - raised in each member's thread, as there
        for r in members:
            r.error = r.error or e


# ----------------------------------------------------------------------------- threads meet here

class Rendezvous:
    """Where the client threads of a vectorized round hand over their `local_sgd` calls.

    `offload` (a client thread) queues a call and waits; `serve` (the calling thread) runs the
    queued calls together whenever every live client thread is waiting, until all have left.
    """

    def __init__(self, threads: int, note: Callable[[str], None]):
        self._cond = threading.Condition()
        self._live, self._pending = threads, []
        self._note = note

    def offload(self, plan: SGDPlan, batches: Iterator[Batch]):
        """`pflkit.fl.train.SGD_OFFLOAD` of a client thread: ``(stats, batches)``, stats None to run it there."""
        why = why_not(plan)
        if why:
            self._note(why)
            return None, batches
        req = Request(plan, batches)
        with self._cond:
            self._pending.append(req)
            self._cond.notify_all()
            while not req.done:
                self._cond.wait()
        if req.error is not None:
            raise req.error
        return req.stats, req.batches

    def leave(self) -> None:
        """A client thread has finished (or failed)."""
        with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def serve(self) -> None:
        """Run the queued calls each time every live thread waits; return when all threads have left."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._live == 0 or len(self._pending) == self._live)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                run_plans(batch, self._note)
            finally:
                with self._cond:
                    for r in batch:
                        r.done = True
                    self._cond.notify_all()


def run_together(calls: list[Callable[[], Any]], note: Callable[[str], None]) -> list[tuple[Any, BaseException | None]]:
    """Run ``calls`` (one per client) in threads whose `local_sgd` calls are batched; ``(result, error)``
    of each, in order. Each thread runs in a copy of the caller's context (the kernel backend...)."""
    meet = Rendezvous(len(calls), note)
    outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)

    def body(i: int, call: Callable[[], Any]) -> None:
        SGD_OFFLOAD.set(meet.offload)
        try:
            outcomes[i] = (call(), None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, in the clients' order
            outcomes[i] = (None, e)
        finally:
            meet.leave()

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(body, i, call), daemon=True,
                                name=f"pflkit-vclient-{i}") for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    meet.serve()
    for t in threads:
        t.join()
    return outcomes
