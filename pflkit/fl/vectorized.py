"""Many clients' local SGD as one computation: ``torch.func.vmap`` over their stacked weights.

The vectorized engine (`pflkit.fl.engines.run_vectorized`) runs each sampled client's
``client_update`` in a thread whose `pflkit.fl.train.local_sgd` calls do not train but wait
(`pflkit.fl.meet`); the calling thread runs the waiting plans together (`run_plans`, here). A client
update that is plain local SGD (FedAvg's) needs no thread: `pflkit.fl.lockstep` plans it, runs the
group here and takes each client's trained state from the stacks (`Request.keep`).

Plans that agree on the architecture, the trainable tensors and the SGD settings form a group
(`pflkit.fl.batchable.signature`, beside what cannot be batched and the memory budget). A group's
parameters, buffers (each client's BatchNorm statistics) and momentum buffers are stacked along a
leading client axis once, and every step is one ``vmap`` of the model's forward over the clients,
one loss for all of them and one ordinary backward pass of their summed losses (client ``i``'s loss
depends on its slice alone, so that gives each its own gradient; a ``vmap(grad(...))`` cost the host
several times more per step), followed by `torch.optim.SGD`'s arithmetic on the stacks; the stacks
go back into the clients' models once.

Lockstep: at step ``s`` every client of the group takes its ``s``-th batch from its own stream,
made by the same generator calls as in the sequential engine, so the clients see the batches
they would see one after another. Where the streams allow it (`positions`: no augmentation, the
data in one tensor) every client's batch positions are drawn up front with those calls and a
step's batches are gathered with one index op from the pooled tensors. A client whose stream has
ended is masked out (its tensors stay as they are) and the group goes on with the others.
Clients whose ``s``-th batch has another size (the short last batch of an epoch) are padded and
their padding masked out of the loss when the model computes each sample on its own
(`pflkit.fl.batchable.paddable`),
else they form a subgroup of their own at that step, because padding would change BatchNorm's
batch statistics.

Memory: with a budget (`pflkit.fl.batchable.memory_budget`: ``$PFLKIT_VECTOR_MEMORY``, on CUDA
half the free memory) a group's first step measures what it takes (`pflkit.fl.batchable.MemoryProbe`:
the activations autograd saves plus the stacked state) and, when the whole group would not fit, the
group runs in chunks that do; running out of memory anyway splits it in halves.

Plans that cannot be batched (`pflkit.fl.batchable.why_not`: a custom criterion, a free-form extra
loss, gradient hooks, dropout, ...) run in their own thread with the ordinary loop, and say why once.
Custom ops run their pure-PyTorch reference inside the vmap (`pflkit.kernels`). The numbers
equal the sequential engine's to float rounding (tests/fl/test_vectorized.py) as training amplifies
it: a deep BatchNorm net moves as far from a one-ulp change of its start (ResNet-18 FedAvg, 2-3
rounds of 5 steps: 0.34-0.46 at most over the server state), and the vectorized run ends about as far.
"""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from pflkit import kernels
from pflkit.errors import Diverged
from pflkit.fl.batchable import GroupFallback, MemoryProbe, fallback_from, memory_budget, paddable, signature
from pflkit.fl.lockstep_batches import Source, loose_steps, pooled_steps
from pflkit.fl.train import Batch, SGDPlan, check_finite, sgd_step

log = logging.getLogger(__name__)

__all__ = ["Request", "run_plans", "run_members"]


# ----------------------------------------------------------------------------- one group in lockstep

@dataclass
class Request:
    """One offloaded `local_sgd` call: its plan and batches in, its stats (or error) out."""

    plan: SGDPlan
    batches: Iterator[Batch]
    stats: dict | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    # keep: leave the trained tensors in ``state`` (the model's state-dict order, views of the group's
    # stacks) instead of copying them into ``plan.model`` (plans may then share one model)
    keep: bool = False
    state: dict | None = None


def _forward_fn(template: nn.Module, names: list[str]) -> Callable:
    """``(*tensors, x) -> outputs`` of one client, its parameters and buffers (``names``, in order) given as
    positional tensors, for ``vmap`` (BatchNorm updates the buffers in place). Positional tensors, not
    dicts: vmap flattens its arguments every call, and a flat tuple costs the host less."""
    def forward(*args):
        return functional_call(template, dict(zip(names, args[:-1])), (args[-1],))
    return forward


def _client_losses(out: torch.Tensor, y: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """Each client's mean cross-entropy (`F.cross_entropy`'s mean over its batch), from the stacked outputs
    ``out`` and labels ``y`` (client axis first); one loss call outside the vmap for all clients.
    ``real``: 1 for a client's real samples, 0 for padding (a padded sample adds an exact zero to the
    sum and to every gradient), the mean over the real ones."""
    per = F.cross_entropy(out.flatten(0, 1), y.flatten(0, 1), reduction="none").view(y.shape[0], -1)
    if real is None:
        return per.mean(1)
    return (per * real).sum(1) / real.sum(1)


def _per_client_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum_t sum(t[i])`` per client ``i`` (client axis first), as Python's ``sum`` adds the tensors."""
    return sum(t.flatten(1).sum(1) for t in tensors)


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
        # once per distinct model: the plans of a round without client threads share one (`Request.keep`)
        models = {id(p.model): p.model for p in plans}
        params = {k: dict(m.named_parameters()) for k, m in models.items()}
        bufs = {k: dict(m.named_buffers()) for k, m in models.items()}
        self.pad = paddable(first.model)
        with torch.no_grad():
            self.P = {n: torch.stack([params[id(p.model)][n].detach() for p in plans]) for n in self.names}
            self.B = {n: torch.stack([bufs[id(p.model)][n] for p in plans]) for n in self.bnames}
            self.A = None if first.prox is None else {
                n: torch.stack([p.prox[1][n].to(self.P[n].device, self.P[n].dtype) for p in plans]) for n in self.names}
            masked = {n for p in plans for n, m in zip(self.train, p.grad_masks or ()) if m is not None}
            self.G = {n: torch.stack([_mask_of(p, n, self.train, self.P[n][0]) for p in plans]) for n in masked}
        self.M = {n: torch.zeros_like(self.P[n]) for n in self.train} if first.momentum else {}
        device = self.P[self.names[0]].device
        self.total = torch.zeros(len(plans), dtype=torch.float64, device=device)
        self.seen, self.taken = [0] * len(plans), [0] * len(plans)
        self.lam = None if first.prox is None else first.prox[0]
        self.forward = vmap(_forward_fn(self.template, self.names + self.bnames))
        self.measure: Callable[[int, int], None] | None = None  # `MemoryProbe.check`, on a budget's first step

    def losses(self, weights: dict, buffers: dict, anchor: dict | None, x: torch.Tensor, y: torch.Tensor,
               real: torch.Tensor | None = None):
        """Each client's loss, the terms of `pflkit.fl.train.run_sgd` in its order: the data term
        (one vmapped forward over the clients), the proximal term, the masked weight decay."""
        out = self.forward(*[weights[n] for n in self.names], *[buffers[n] for n in self.bnames], x)
        value = _client_losses(out, y, real)
        if self.lam is not None:
            value = value + 0.5 * self.lam * _per_client_sum((weights[n] - anchor[n]).pow(2) for n in self.names)
        decay = self.plans[0].loss_decay
        if decay > 0:
            value = value + 0.5 * decay * _per_client_sum(weights[n].pow(2) for n in self.train)
        return value

    def step(self, idx: list[int], x: torch.Tensor, y: torch.Tensor, counts: list[int] | None = None) -> None:
        """One SGD step of the clients ``idx`` on their stacked batches ``x``, ``y`` (client axis first);
        ``counts``: each client's real samples, the first of its row (the rest pad it; `paddable` groups).

        The gradient of the clients' summed losses with respect to their stacked weights is each client's
        own gradient (client ``i``'s loss depends on its slice only), so one ordinary backward pass
        through the vmapped forward gives them all."""
        plan = self.plans[0]
        full = idx == list(range(len(self.plans)))
        sel = None if full else torch.tensor(idx, device=x.device)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t if full else t.index_select(0, sel)

        # leaves sharing the stacks' storage (a subgroup's: copies, written back below)
        trainable = {n: take(self.P[n]).detach().requires_grad_() for n in self.train}
        buffers = {n: take(self.B[n]) for n in self.bnames}  # BatchNorm updates these in place
        anchor = None if self.A is None else {n: take(self.A[n]) for n in self.names}
        real = None
        if counts is not None and min(counts) < y.shape[1]:
            real = (torch.arange(y.shape[1], device=y.device) < torch.tensor(counts, device=y.device)[:, None])
            real = real.to(x.dtype if x.is_floating_point() else torch.float32)
        sizes = torch.tensor(counts or [y.shape[1]] * len(idx), device=self.total.device, dtype=torch.float64)
        with torch.enable_grad():
            if self.measure is not None:
                with MemoryProbe.saved() as saved:
                    losses = self.losses({**trainable, **{n: take(self.P[n]) for n in self.frozen}}, buffers,
                                         anchor, x, y, real)
                self.measure(saved.bytes + self.state_bytes() * len(idx) // len(self.plans), len(idx))
                self.measure = None
            else:
                losses = self.losses({**trainable, **{n: take(self.P[n]) for n in self.frozen}}, buffers, anchor, x, y,
                                     real)
            grads = dict(zip(self.train, torch.autograd.grad(losses.sum(), [trainable[n] for n in self.train])))
            losses = losses.detach()
        with torch.no_grad():
            if not full:
                for n in self.bnames:
                    self.B[n].index_copy_(0, sel, buffers[n])
            grads = {n: grads[n] * take(self.G[n]) if n in self.G else grads[n] for n in self.train}
            if plan.max_grad_norm > 0:
                grads = _clipped(grads, self.train, plan.max_grad_norm)
            # SGD's step on the stacks, in place (on copies for a subgroup, written back); elementwise, so
            # per client; the zero momentum buffers make each client's first buffer its gradient, as SGD's copy
            weights = [trainable[n].detach() for n in self.train]
            bufs = sgd_step(weights, [grads[n] for n in self.train],
                            [take(self.M[n]) for n in self.train] if plan.momentum else [None] * len(self.train),
                            lr=plan.lr, momentum=plan.momentum, weight_decay=plan.weight_decay)
            for n, w, buf in zip(self.train, weights, bufs):
                if not full:
                    self.P[n].index_copy_(0, sel, w)
                    if buf is not None:
                        self.M[n].index_copy_(0, sel, buf)
            if full:
                self.total.add_(losses.double() * sizes)
            else:
                self.total.index_add_(0, torch.tensor(idx, device=self.total.device), losses.double() * sizes)
        for j, i in enumerate(idx):
            self.seen[i] += counts[j] if counts else y.shape[1]
            self.taken[i] += 1

    def state_bytes(self) -> int:
        """Bytes of the group's stacked state and of one step's gradients (every client)."""
        stacks = itertools.chain(self.P.values(), self.B.values(), self.M.values(), self.G.values(),
                                 (self.A or {}).values(), (self.P[n] for n in self.train))
        return sum(t.numel() * t.element_size() for t in stacks)

    def write_back(self, which: list[int]) -> None:
        """Clients ``which``'s trained tensors into their own models (what the ordinary loop leaves there)."""
        with torch.no_grad():
            for i in which:
                plan = self.plans[i]
                params, buffers = dict(plan.model.named_parameters()), dict(plan.model.named_buffers())
                for n in self.names:
                    params[n].copy_(self.P[n][i])
                for n in self.bnames:
                    buffers[n].copy_(self.B[n][i])

    def states(self, which: list[int]) -> dict[int, dict[str, torch.Tensor]]:
        """Clients ``which``'s trained tensors as `pflkit.fl.train.get_state` would take them from their
        models (the template's state-dict keys and order): views of the stacks, which the group no longer
        changes, so no copy is taken."""
        where = {id(t): ("P", n) for n, t in self.template.named_parameters()}
        where.update({id(t): ("B", n) for n, t in self.template.named_buffers()})
        keys = [(k, where[id(t)]) for k, t in self.template.state_dict(keep_vars=True).items()]
        cols = {(kind, n): (self.P if kind == "P" else self.B)[n].unbind(0) for _, (kind, n) in keys}
        return {i: {k: cols[at][i] for k, at in keys} for i in which}

    def stats(self, i: int, total: float) -> dict:
        """`local_sgd`'s return value for client ``i`` whose summed loss is ``total`` (`Diverged` on a
        non-finite loss)."""
        loss = check_finite(total, self.plans[i].where) / max(self.seen[i], 1)
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


def _run_group(reqs: list[Request], budget: int | None = None) -> None:
    """Train one group of requests in lockstep and fill in their stats or errors; with a memory ``budget``
    (bytes), the first step measures what a client takes (`MemoryProbe`) and stops the group before
    anything moves when all of them would take more."""
    try:
        group = _Group([r.plan for r in reqs])
    except Exception as e:
        raise fallback_from(e) from e
    if budget is not None:
        group.measure = MemoryProbe(budget, len(reqs)).check
    src = Source(reqs)
    live, step = list(range(len(reqs))), 0
    while live:
        got: dict = {}
        if src.pooled:
            live, work = pooled_steps(src, live, step, group.pad)
        else:
            live, work, got = loose_steps(src, live, step)
        for idx, (x, y), counts in work:
            try:
                group.step(idx, x, y, counts)
            except Exception as e:
                if step > 0:
                    raise
                src.restart(live, got, 0)  # nothing has moved yet: each plan starts over with its batches
                raise e if isinstance(e, GroupFallback) else fallback_from(e) from e
        step += 1
    group.write_back([i for i, r in enumerate(reqs) if not r.keep])
    kept = group.states([i for i, r in enumerate(reqs) if r.keep])
    for i, (r, total) in enumerate(zip(reqs, group.total.tolist())):  # one sync for all clients
        if r.error is None:
            r.state = kept.get(i)
            try:
                r.stats = group.stats(i, total)
            except Diverged as e:
                r.error = e


def run_plans(reqs: list[Request], note: Callable[[str], None]) -> None:
    """Run every request: the groups of equal `signature` one after another, each in lockstep.

    A group whose first step measures more than the memory budget (`memory_budget`, `MemoryProbe`)
    runs in chunks that fit; a group too large for the device's memory is split in halves, until it
    fits. A group whose first step fails otherwise (an op without a batching rule, say) leaves its
    requests without stats: their threads run them with the ordinary loop; ``note`` hears why.
    """
    groups: dict[tuple, list[Request]] = {}
    for r in reqs:
        groups.setdefault(signature(r.plan), []).append(r)
    with kernels.use_backend("reference"):  # custom ops: their vmappable pure-PyTorch twins
        for members in groups.values():
            device = next(members[0].plan.model.parameters()).device
            run_members(members, note, memory_budget(device))


def run_members(members: list[Request], note: Callable[[str], None], budget: int | None = None) -> None:
    """Run one group of requests of equal `signature` in lockstep (`run_plans`' work per group): in chunks
    that fit the memory ``budget``, in halves after running out of memory; requests left without stats
    when the group could not start (``note`` hears why); errors set on the requests."""
    try:
        _run_group(members, budget)
    except GroupFallback as e:
        if not (e.memory and len(members) > 1):
            note(f"the vmapped step failed ({e})")
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if e.per_client:
            size = max(1, min(len(members) - 1, budget // e.per_client))
            note(f"{e}; they run in chunks of {size}")
            for i in range(0, len(members), size):
                run_members(members[i:i + size], note, budget)
            return
        half = len(members) // 2
        note(f"{len(members)} clients at once ran out of memory; they run in halves")
        run_members(members[:half], note, budget)
        run_members(members[half:], note, budget)
    except Exception as e:  # noqa: BLE001 - raised in each member's thread, as there
        for r in members:
            r.error = r.error or e
