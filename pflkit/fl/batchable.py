"""What the vectorized engine may batch, into which groups, within what memory.

`pflkit.fl.vectorized` runs groups of local-SGD plans in lockstep; this module decides beforehand:
whether a plan can run in a vmapped group at all (`why_not`), which plans share a group
(`signature`), whether a group may pad a short batch (`paddable`), and how much memory a group's
step may take (`memory_budget`, measured by `MemoryProbe` on the first step). `GroupFallback` is
how a group says it could not start (nothing has moved yet) and why.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import types

import torch
from torch import nn

from pflkit.fl.train import SGDPlan


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



class GroupFallback(Exception):
    """A group's stacking or first vmapped step failed: nothing has moved yet. ``memory``: it ran out of
    memory (then halves of the group are tried); ``per_client``: the bytes one client's step takes, when
    the group's first step measured more than the memory budget (then chunks that fit are tried)."""

    def __init__(self, why: str, memory: bool, per_client: int = 0):
        super().__init__(why)
        self.memory, self.per_client = memory, per_client


def fallback_from(e: Exception) -> GroupFallback:
    """The `GroupFallback` of an error raised while a group starts (out of memory or not)."""
    memory = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)
    return GroupFallback(f"{type(e).__name__}: {' '.join(str(e).split())[:160]}", memory)


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
    `check` stops the group (`GroupFallback` with the bytes per client) when the whole group would take
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
            raise GroupFallback(f"{self.clients} clients take about {per_client * self.clients / 2**20:.1f} MiB a step, "
                            f"over the budget of {self.budget / 2**20:.1f} MiB", True, per_client)
