"""Local training and evaluation on one client: the helpers every algorithm shares.

These are the plain-SGD building blocks (FedAvg's local epochs, Local, fine-tuning
baselines, personal heads). They work on an `nn.Module` the caller owns and on a
`Client`'s splits; they never touch global state, and their randomness comes from
the generator passed in.
"""
from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from pflkit.errors import Diverged
from pflkit.fl.federation import Client


def get_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the model's state dict (parameters and buffers)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_state(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> nn.Module:
    """Load ``state`` into ``model`` (copying) and return the model."""
    model.load_state_dict(state, strict=strict)
    return model


def check_finite(value: float, where: str) -> float:
    if not math.isfinite(value):
        raise Diverged(f"non-finite loss ({value}) in {where}")
    return value


def make_sgd(params: Iterable[torch.nn.Parameter], lr: float, momentum: float = 0.0,
             weight_decay: float = 0.0) -> torch.optim.SGD:
    return torch.optim.SGD(list(params), lr=lr, momentum=momentum, weight_decay=weight_decay)


Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SGDPlan:
    """One `local_sgd` call without its batches: the model it trains in place and how.

    The loop over the batches is `run_sgd`; the vectorized engine (`pflkit.fl.vectorized`)
    runs the plans of many clients together instead, from the same batch streams.

    Attributes:
        model: the module trained in place (its parameters and buffers).
        params: the parameters that move (the others stay as they are).
        lr, momentum, weight_decay: `torch.optim.SGD`'s settings.
        max_grad_norm: clip the gradient of ``params`` to this 2-norm (0: no clipping).
        extra_loss: ``extra_loss(model)`` added to the loss (a free-form regularizer).
        criterion: ``criterion(model, x, y)`` replacing the mean cross-entropy.
        prox: ``(lam, anchor)``: adds ``lam / 2 * sum ||p - anchor[name]||^2`` over the model's
            parameters (`proximal_penalty`; Ditto's pull toward the global model).
        loss_decay: adds ``loss_decay / 2 * sum ||p||^2`` over ``params``: a weight decay that,
            unlike SGD's, passes through ``grad_masks``.
        grad_masks: one mask (or None) per entry of ``params``, multiplying that parameter's
            gradient (FedSelect's frozen entries: 0); applied before clipping.
        where: names the training in a `Diverged` error.
    """

    model: nn.Module
    params: list[torch.nn.Parameter]
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None
    criterion: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    prox: tuple[float, dict[str, torch.Tensor]] | None = None
    loss_decay: float = 0.0
    grad_masks: list[torch.Tensor | None] | None = None
    where: str = "local training"


# Set by the vectorized engine in each client thread: ``offload(plan, batches) -> (stats, batches)``
# trains the plan elsewhere and returns its stats, or returns ``(None, batches)`` (the batches not
# drawn yet) for `local_sgd` to run the loop here. Unset (None): the loop always runs here.
SGD_OFFLOAD: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("pflkit_sgd_offload", default=None)


def proximal_penalty(named_params: Iterable[tuple[str, torch.Tensor]], anchor: dict[str, torch.Tensor],
                     lam: float) -> torch.Tensor:
    """``lam / 2 * sum_name ||p - anchor[name]||^2`` (Ditto's regularizer h_k, FedProx's term)."""
    return 0.5 * lam * sum((p - anchor[n].to(p.device)).pow(2).sum() for n, p in named_params)


def _batch_stream(client: Client, split: str, batch_size: int, generator: torch.Generator, epochs: int, steps: int,
                  device, augment: bool) -> Iterator[Batch]:
    if steps > 0:
        for _ in range(steps):
            yield client.random_batch(split, batch_size, generator, device, augment)
    else:
        for _ in range(epochs):
            yield from client.batches(split, batch_size, generator, shuffle=True, device=device, augment=augment)


@dataclass
class BatchStream:
    """`sgd_batches`' iterator: the batches drawn lazily, on the first `next`, and the recipe that draws
    them (its fields), from which the vectorized engine draws the positions of many clients' batches with
    the same generator calls and gathers them together (`pflkit.fl.vectorized.positions`)."""

    client: Client
    split: str
    batch_size: int
    generator: torch.Generator
    epochs: int = 1
    steps: int = 0
    device: object = None
    augment: bool = True
    _it: Iterator[Batch] | None = field(default=None, repr=False, compare=False)

    @property
    def started(self) -> bool:
        """Whether a batch has been drawn (the recipe no longer says what is left)."""
        return self._it is not None

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> Batch:
        if self._it is None:
            self._it = _batch_stream(self.client, self.split, self.batch_size, self.generator, self.epochs,
                                     self.steps, self.device, self.augment)
        return next(self._it)


def sgd_batches(client: Client, split: str, batch_size: int, generator: torch.Generator, *, epochs: int = 1,
                steps: int = 0, device=None, augment: bool = True) -> BatchStream:
    """The batches of a local training, drawn lazily from ``generator``: ``steps`` fresh random batches
    when ``steps > 0`` (pFedHN's K local steps), else ``epochs`` shuffled passes over ``split``."""
    return BatchStream(client, split, batch_size, generator, epochs, steps, device, augment)


def local_sgd(model: nn.Module, client: Client, *, lr: float, batch_size: int, generator: torch.Generator,
              epochs: int = 1, steps: int = 0, momentum: float = 0.0, weight_decay: float = 0.0,
              params: Iterable[torch.nn.Parameter] | None = None, max_grad_norm: float = 0.0,
              extra_loss: Callable[[nn.Module], torch.Tensor] | None = None, split: str = "train",
              augment: bool = True, device=None, where: str = "local training",
              criterion: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
              prox: tuple[float, dict[str, torch.Tensor]] | None = None, loss_decay: float = 0.0,
              grad_masks: list[torch.Tensor | None] | None = None) -> dict[str, float]:
    """Plain (momentum) SGD on a client's split; the model is trained in place.

    Runs ``steps`` steps on fresh random batches when ``steps > 0`` (pFedHN's K local
    steps), otherwise ``epochs`` shuffled passes. ``params`` restricts which parameters
    move (FedPer heads, FedBABU bodies) and ``grad_masks`` which of their entries (FedSelect);
    ``prox = (lam, anchor)`` adds Ditto's / FedProx's proximal term, ``loss_decay`` a weight
    decay the masks apply to, ``extra_loss(model)`` any other regularizer (a free-form one keeps
    the vectorized engine from batching this call). ``criterion(model, x, y)`` replaces the data
    term, the mean cross-entropy of ``model(x)`` (pFedVEM's base step averages it over sampled
    heads). Raises `Diverged` on a non-finite loss (checked once, after the last step: the
    losses are summed on the device, so no step waits for the host).

    Returns:
        ``{"loss": mean training loss, "steps": steps taken, "samples": samples seen}``.
    """
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    plan = SGDPlan(model, params, lr, momentum, weight_decay, max_grad_norm, extra_loss, criterion, prox, loss_decay,
                   grad_masks, where)
    batches = sgd_batches(client, split, batch_size, generator, epochs=epochs, steps=steps, device=device,
                          augment=augment)
    offload = SGD_OFFLOAD.get()
    if offload is not None:
        model.train()  # the mode the plan is run in, wherever that is
        stats, batches = offload(plan, batches)
        if stats is not None:
            return stats
    return run_sgd(plan, batches)


def sgd_step(params: list[torch.Tensor], grads: list[torch.Tensor | None], buffers: list[torch.Tensor | None], *,
             lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> list[torch.Tensor | None]:
    """One step of `torch.optim.SGD` (no dampening, no Nesterov) on ``params``, in place, with the
    same float operations; returns the momentum buffers (None before a parameter's first step).

    A parameter whose gradient is None is skipped, as SGD skips it. The vectorized engine runs
    it on stacked tensors (a leading client axis: every operation is elementwise), starting
    from zero buffers, which give the first step's buffer SGD's copy of the gradient exactly.
    Cheaper than the optimizer object in a client's inner loop (no parameter groups, hooks or
    profiler records each step: Python time that worker threads would contend for).
    """
    out = []
    for p, g, buf in zip(params, grads, buffers):
        if g is not None:
            d = g.add(p, alpha=weight_decay) if weight_decay != 0 else g
            if momentum != 0:
                buf = torch.clone(d).detach() if buf is None else buf.mul_(momentum).add_(d)
                d = buf
            p.add_(d, alpha=-lr)
        out.append(buf)
    return out


def run_sgd(plan: SGDPlan, batches: Iterable[Batch]) -> dict[str, float]:
    """`local_sgd`'s loop: one SGD step of ``plan`` per batch, here, on ``plan.model``."""
    model, params = plan.model, plan.params
    if not params:
        raise ValueError(f"{plan.where}: no parameter to train (empty parameter list)")
    buffers: list[torch.Tensor | None] = [None] * len(params)
    model.train()
    total, seen, taken = 0.0, 0, 0
    for xb, yb in batches:
        for p in params:
            p.grad = None
        loss = F.cross_entropy(model(xb), yb) if plan.criterion is None else plan.criterion(model, xb, yb)
        if plan.prox is not None:
            loss = loss + proximal_penalty(model.named_parameters(), plan.prox[1], plan.prox[0])
        if plan.loss_decay > 0:
            loss = loss + 0.5 * plan.loss_decay * sum(p.pow(2).sum() for p in params)
        if plan.extra_loss is not None:
            loss = loss + plan.extra_loss(model)
        loss.backward()
        with torch.no_grad():
            for p, mask in zip(params, plan.grad_masks or ()):
                if mask is not None and p.grad is not None:
                    p.grad.mul_(mask)
            if plan.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm)
            buffers = sgd_step(params, [p.grad for p in params], buffers, lr=plan.lr, momentum=plan.momentum,
                               weight_decay=plan.weight_decay)
        # float64 on the device: the same sum as Python floats, without a sync per step
        total = total + loss.detach().double() * len(yb)
        seen += len(yb)
        taken += 1
    return {"loss": check_finite(float(total), plan.where) / max(seen, 1), "steps": taken, "samples": seen}


def round_sgd(model: nn.Module, client: Client, cfg, env, *, key: tuple = (), **overrides) -> dict[str, float]:
    """`local_sgd` with the round's settings of an `FLConfig`: one call for every algorithm.

    The learning rate is ``cfg.lr_at(env.round)``; batch size, ``local_epochs`` /
    ``local_steps``, momentum, weight decay and clipping come from ``cfg``; the batches
    from ``env.generator("client", client.id, env.round, *key)`` (``key`` tells apart
    several trainings of one client in one round: Ditto's personal model, FedSelect's
    passes). ``overrides`` replace or add `local_sgd` keywords (``params``,
    ``extra_loss``, ``epochs``, ``where``, ...).
    """
    settings = {"lr": cfg.lr_at(env.round), "batch_size": cfg.batch_size, "epochs": cfg.local_epochs,
                "steps": cfg.local_steps, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
                "max_grad_norm": cfg.max_grad_norm, "device": env.device, "where": f"client {client.id}"}
    generator = env.generator("client", client.id, env.round, *key)
    return local_sgd(model, client, generator=generator, **{**settings, **overrides})


def finetune_sgd(model: nn.Module, client: Client, cfg, env, *, lr: float, epochs: int,
                 params: Iterable[torch.nn.Parameter] | None = None) -> dict[str, float]:
    """Personalization by fine-tuning at evaluation time (FT baselines, FedBABU).

    ``epochs`` shuffled passes over the train split at ``lr``, with ``cfg``'s batch size,
    momentum, weight decay and clipping. The batches come from
    ``env.generator("finetune", client.id)``, not keyed by round: every evaluation of a
    client fine-tunes the same way.
    """
    return local_sgd(model, client, lr=lr, batch_size=cfg.batch_size, epochs=epochs,
                     generator=env.generator("finetune", client.id), momentum=cfg.momentum,
                     weight_decay=cfg.weight_decay, params=params, max_grad_norm=cfg.max_grad_norm,
                     device=env.device, where=f"fine-tuning client {client.id}")

@torch.no_grad()
def evaluate_model(model: nn.Module, client: Client, split: str = "test", batch_size: int = 512,
                   device=None) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on a client's split (eval mode)."""
    model.eval()
    correct, loss, n = 0, 0.0, 0
    for xb, yb in client.batches(split, batch_size, device=device):
        out = model(xb)
        # summed on the device (loss in float64, as Python floats would): one sync at the end
        loss = loss + F.cross_entropy(out, yb, reduction="sum").double()
        correct = correct + (out.argmax(1) == yb).sum()
        n += len(yb)
    if n == 0:
        return {"acc": float("nan"), "loss": float("nan"), "n": 0, "correct": 0}
    correct = int(correct)
    return {"acc": correct / n, "loss": float(loss) / n, "n": n, "correct": correct}


def client_batches(client: Client, split: str, batch_size: int = 512, device=None):
    """Inputs only, for statistics passes (BN statistics, FedL2P client features)."""
    for xb, _ in client.batches(split, batch_size, device=device):
        yield xb
