"""Many clients' local SGD as one computation: ``torch.func.vmap`` over their stacked weights.

The vectorized engine (`pflkit.fl.engines.run_vectorized`) runs each sampled client's
``client_update`` in a thread whose `pflkit.fl.train.local_sgd` calls do not train but wait
(`pflkit.fl.meet`); the calling thread runs the waiting plans together (`run_plans`, here). A client
update that is plain local SGD (FedAvg's) needs no thread: `pflkit.fl.lockstep` plans it, runs the
group here and takes each client's trained state from the stacks (`Request.keep`).

Plans that agree on the architecture, the trainable tensors and the SGD settings form a group
(`signature`). A group's parameters, buffers (each client's BatchNorm statistics) and momentum
buffers are stacked along a leading client axis once, and every step is one ``vmap`` of the
model's forward over the clients, one loss for all of them and one ordinary backward pass of
their summed losses (client ``i``'s loss depends on its slice alone, so that gives each its own
gradient; a ``vmap(grad(...))`` cost the host several times more per step), followed by
`torch.optim.SGD`'s arithmetic on the stacks; the stacks go back into the clients' models once.

Lockstep: at step ``s`` every client of the group takes its ``s``-th batch from its own stream,
made by the same generator calls as in the sequential engine, so the clients see the batches
they would see one after another. Where the streams allow it (`positions`: no augmentation, the
data in one tensor) every client's batch positions are drawn up front with those calls and a
step's batches are gathered with one index op from the pooled tensors. A client whose stream has
ended is masked out (its tensors stay as they are) and the group goes on with the others.
Clients whose ``s``-th batch has another size (the short last batch of an epoch) are padded and
their padding masked out of the loss when the model computes each sample on its own (`paddable`),
else they form a subgroup of their own at that step, because padding would change BatchNorm's
batch statistics.

Memory: with a budget (`memory_budget`: ``$PFLKIT_VECTOR_MEMORY``, on CUDA half the free memory)
a group's first step measures what it takes (`MemoryProbe`: the activations autograd saves plus
the stacked state) and, when the whole group would not fit, the group runs in chunks that do;
running out of memory anyway splits it in halves.

Plans that cannot be batched (`why_not`: a custom criterion, a free-form extra loss, gradient
hooks, dropout, ...) run in their own thread with the ordinary loop, and say why once.
Custom ops run their pure-PyTorch reference inside the vmap (`pflkit.kernels`). The numbers
equal the sequential engine's to float rounding (tests/fl/test_vectorized.py) as training amplifies
it: a deep BatchNorm net moves as far from a one-ulp change of its start (ResNet-18 FedAvg, 2-3
rounds of 5 steps: 0.34-0.46 at most over the server state), and the vectorized run ends about as far.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import types
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from pflkit import kernels
from pflkit.errors import Diverged
from pflkit.fl.lockstep_batches import Source, loose_steps, pooled_steps
from pflkit.fl.train import Batch, SGDPlan, check_finite, sgd_step

log = logging.getLogger(__name__)

__all__ = ["why_not", "signature", "run_plans", "run_members", "Request", "paddable", "memory_budget", "MemoryProbe"]


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
    done: threading.Event = field(default_factory=threading.Event)
    # keep: leave the trained tensors in ``state`` (the model's state-dict order, views of the group's
    # stacks) instead of copying them into ``plan.model`` (plans may then share one model)
    keep: bool = False
    state: dict | None = None


class _Fallback(Exception):
    """A group's stacking or first vmapped step failed: nothing has moved yet. ``memory``: it ran out of
    memory (then halves of the group are tried); ``per_client``: the bytes one client's step takes, when
    the group's first step measured more than the memory budget (then chunks that fit are tried)."""

    def __init__(self, why: str, memory: bool, per_client: int = 0):
        super().__init__(why)
        self.memory, self.per_client = memory, per_client


def _fallback(e: Exception) -> _Fallback:
    memory = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
    return _Fallback(f"{type(e).__name__}: {' '.join(str(e).split())[:160]}", memory)


# leaf modules whose output for one sample depends on that sample alone: a group of models made of these
# (and containers) can pad a short batch with masked samples; BatchNorm and anything unknown cannot
PER_SAMPLE = (nn.Linear, nn.Bilinear, nn.Identity, nn.Flatten, nn.Unflatten, nn.Embedding, nn.ReLU, nn.ReLU6,
              nn.LeakyReLU, nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.Softplus, nn.Hardswish, nn.Mish,
              nn.modules.conv._ConvNd, nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
              nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd, nn.LayerNorm,
              nn.GroupNorm, nn.modules.dropout._DropoutNd)


def paddable(model: nn.Module) -> bool:
    """Whether padding a batch with extra samples leaves the real samples' outputs as they are: no
    buffers (BatchNorm's statistics), every leaf module in `PER_SAMPLE` (dropout only at p = 0 or in
    eval mode; `why_not` has kept the others out)."""
    if next(model.buffers(), None) is not None:
        return False
    leaves = (m for m in model.modules() if next(m.children(), None) is None)
    return all(isinstance(m, PER_SAMPLE) for m in leaves)


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
        raise _fallback(e) from e
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
                raise e if isinstance(e, _Fallback) else _fallback(e) from e
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


# ----------------------------------------------------------------------------- memory budget

def memory_budget(device: torch.device) -> int | None:
    """Bytes a group's step may take: ``$PFLKIT_VECTOR_MEMORY`` (bytes) when set, else on CUDA half the
    memory free now (what a step measures, `MemoryProbe`, leaves out the transient buffers), else None
    (no budget: the CPU's memory is the process's)."""
    value = os.environ.get("PFLKIT_VECTOR_MEMORY", "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"PFLKIT_VECTOR_MEMORY={value!r}: expected a positive number of bytes")
        return int(value)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return None


class MemoryProbe:
    """What one step of a group takes, measured on its first step: the bytes autograd saves for the
    backward pass (the activations, counted once per storage) plus the stacked state and gradients;
    `check` stops the group (`_Fallback` with the bytes per client) when the whole group would take
    more than the budget."""

    def __init__(self, budget: int, clients: int):
        self.budget, self.clients = budget, clients

    @staticmethod
    @contextlib.contextmanager
    def saved():
        """Counts the bytes of the tensors autograd saves inside the block (``.bytes``)."""
        seen: set = set()
        out = types.SimpleNamespace(bytes=0)

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                out.bytes += storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield out

    def check(self, measured: int, stepped: int) -> None:
        """``measured`` bytes for a first step of ``stepped`` clients: raise when all would not fit."""
        per_client = -(-measured // max(stepped, 1))
        if per_client * self.clients > self.budget:
            raise _Fallback(f"{self.clients} clients take about {per_client * self.clients / 2**20:.1f} MiB a step, "
                            f"over the budget of {self.budget / 2**20:.1f} MiB", True, per_client)


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
    except _Fallback as e:
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
