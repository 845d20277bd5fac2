"""pFedHN's hypernetwork h(v; phi) and its server optimizer (Shamsian et al., ICML 2021).

The hypernetwork lives on the server. A client descriptor ``v_i`` (a trainable
embedding, or a fixed vector such as the class proportions of App. C.5) goes
through a fully connected trunk, then one linear head per tensor of the target
network emits that tensor (sec. 3.2, App. B: 3 hidden layers of 100 units).
Following the authors' code, the trunk is ``Linear(d, 100)`` followed by
``depth`` blocks of ``ReLU, Linear(100, 100)``, and the heads read the last
linear output directly (no activation in between). ``spectral_norm`` wraps every
linear layer of the hypernetwork (App. C.3).

The server update of Alg. 1 is a vector-Jacobian product: given the client's
``delta theta = theta_tilde - theta``, `surrogate_grads` returns the gradient of
``1/2 ||theta_tilde - h(v; phi)||^2`` at ``theta_tilde`` fixed, i.e.
``-(d theta / d (phi, v))^T delta theta`` (sec. 3.2). Descending it moves
``phi`` towards ``theta_tilde`` (the authors' code; the printed sign of Alg. 1
reads the other way). `server_step` is the optimizer as a pure function of
tensors, so its state lives in the server state and checkpoints resume exactly.
"""
from __future__ import annotations

import copy
import json
import math
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm as _spectral_norm

Tensors = dict[str, torch.Tensor]


def default_embed_dim(num_clients: int) -> int:
    """floor(1 + n / 4), the embedding size of App. C.2.2."""
    return int(1 + num_clients / 4)


def _key(name: str) -> str:
    # ModuleDict keys may not contain "."; "/" (budget groups) is fine once escaped too
    return name.replace(".", "__").replace("/", "--")


def _linear(n_in: int, n_out: int, sn: bool) -> nn.Module:
    layer = nn.Linear(n_in, n_out)
    return _spectral_norm(layer) if sn else layer


class HyperNetwork(nn.Module):
    """h(v; phi): client embedding -> MLP trunk -> one linear head per target tensor.

    Args:
        num_clients: rows of the embedding table (one per client).
        targets: ``{tensor name: shape}`` of everything the hypernetwork emits.
        embed_dim: embedding size (ignored when ``fixed_embeddings`` is given).
        hidden: width of the trunk (100 in the paper).
        depth: hidden-to-hidden layers of the trunk (3 in the paper; App. C.2.3 varies 1..5).
        spectral_norm: spectral normalization of every linear layer (App. C.3).
        fixed_embeddings: (num_clients, d) non-trainable descriptors (App. C.5), or None
            for trainable embeddings initialized N(0, embed_std^2).
        embed_std: scale of the trainable embeddings' initialization (1: ``nn.Embedding``'s
            N(0, 1), the authors' code).
    """

    def __init__(self, num_clients: int, targets: Mapping[str, Sequence[int]], *, embed_dim: int = 0,
                 hidden: int = 100, depth: int = 3, spectral_norm: bool = False,
                 fixed_embeddings: torch.Tensor | None = None, embed_std: float = 1.0):
        super().__init__()
        if not targets:
            raise ValueError("targets is empty: the hypernetwork must emit at least one tensor")
        if num_clients < 1 or hidden < 1 or depth < 0:
            raise ValueError(f"need num_clients >= 1, hidden >= 1, depth >= 0; got {num_clients}, {hidden}, {depth}")
        if fixed_embeddings is not None:
            fixed = torch.as_tensor(fixed_embeddings, dtype=torch.float32)
            if fixed.ndim != 2 or fixed.shape[0] != num_clients:
                raise ValueError(f"fixed_embeddings must be ({num_clients}, d), got {tuple(fixed.shape)}")
            self.register_buffer("embeddings", fixed.clone())
            embed_dim = fixed.shape[1]
        else:
            if embed_dim < 1:
                raise ValueError(f"embed_dim={embed_dim}: must be >= 1")
            self.embeddings = nn.Parameter(embed_std * torch.randn(num_clients, embed_dim))
        self.targets = {n: tuple(int(s) for s in shape) for n, shape in targets.items()}
        self.trunk = nn.ModuleList([_linear(embed_dim, hidden, spectral_norm)]
                                   + [_linear(hidden, hidden, spectral_norm) for _ in range(depth)])
        self.heads = nn.ModuleDict({_key(n): _linear(hidden, math.prod(s), spectral_norm)
                                    for n, s in self.targets.items()})

    @property
    def trainable_embeddings(self) -> bool:
        return isinstance(self.embeddings, nn.Parameter)

    def features(self, v: torch.Tensor) -> torch.Tensor:
        x = self.trunk[0](v)
        for layer in self.trunk[1:]:
            x = layer(F.relu(x))
        return x

    def generate(self, v: torch.Tensor, names: Sequence[str] | None = None) -> Tensors:
        """Target tensors for one embedding ``v`` (shape (d,)); only ``names`` if given."""
        z = self.features(v)
        names = list(self.targets) if names is None else list(names)
        return {n: self.heads[_key(n)](z).view(self.targets[n]) for n in names}

    def forward(self, client: int, names: Sequence[str] | None = None) -> Tensors:
        """theta_i = h(v_i; phi) for client row ``client``."""
        return self.generate(self.embeddings[client], names)


def spec_of(num_clients: int, targets: Mapping[str, Sequence[int]], *, embed_dim: int, hidden: int, depth: int,
            spectral_norm: bool, fixed: bool, embed_std: float = 1.0) -> dict:
    """The plain-data description a hypernetwork is rebuilt from (kept in the server state)."""
    return {"num_clients": int(num_clients), "targets": {n: tuple(s) for n, s in targets.items()},
            "embed_dim": int(embed_dim), "hidden": int(hidden), "depth": int(depth),
            "spectral_norm": bool(spectral_norm), "fixed": bool(fixed), "embed_std": float(embed_std)}


def build(spec: dict, fixed_embeddings: torch.Tensor | None = None) -> HyperNetwork:
    """A freshly initialized hypernetwork (torch's default init; seed the global RNG first)."""
    return HyperNetwork(spec["num_clients"], spec["targets"], embed_dim=spec["embed_dim"], hidden=spec["hidden"],
                        depth=spec["depth"], spectral_norm=spec["spectral_norm"],
                        fixed_embeddings=fixed_embeddings if spec["fixed"] else None,
                        embed_std=spec.get("embed_std", 1.0))


_SKELETONS: dict[str, HyperNetwork] = {}


def _skeleton(spec: dict) -> HyperNetwork:
    """A storage-free (meta device) hypernetwork of this spec, built once per spec."""
    key = json.dumps(spec, sort_keys=True, default=list)
    if key not in _SKELETONS:
        with torch.device("meta"):  # no allocation, no random init
            fixed = torch.empty(spec["num_clients"], spec["embed_dim"]) if spec["fixed"] else None
            _SKELETONS[key] = build(spec, fixed)
    return _SKELETONS[key]


def materialize(spec: dict, tensors: Tensors) -> HyperNetwork:
    """A hypernetwork whose parameters *are* ``tensors`` (no copy, no random init).

    A copy of a cached meta-device skeleton filled with ``load_state_dict(assign=True)``,
    so rebuilding it every round costs almost nothing. Callers that update
    parameters in place must pass copies. Always in eval mode (spectral norm then
    uses its stored power-iteration vectors, so a broadcast and its update see one h).
    """
    net = copy.deepcopy(_skeleton(spec))
    net.load_state_dict(tensors, assign=True)
    return net.eval()


@torch.no_grad()
def refresh_spectral_norm(net: HyperNetwork) -> None:
    """One power iteration of every spectrally normalized layer (updates u, v in place)."""
    was = net.training
    net.train()
    for m in net.modules():
        if hasattr(m, "parametrizations"):
            _ = m.weight  # reading the weight in train mode runs the power iteration
    net.train(was)


def surrogate_grads(net: HyperNetwork, rows: Sequence[int], deltas: Sequence[Tensors],
                    weights: Sequence[float] | None = None) -> Tensors:
    """Gradient of ``sum_i w_i 1/2 ||theta_tilde_i - h(v_i; phi)||^2`` at theta_tilde fixed.

    Equals ``-sum_i w_i (d h(v_i) / d (phi, v))^T delta_i`` (sec. 3.2, Alg. 1), one
    vector-Jacobian product through the hypernetwork; only the target's size
    (``delta_i``) came from the client. Parameters that no delta reaches (other
    budget groups' heads) get zero gradients.

    Returns:
        ``{parameter name: gradient}`` for every trainable parameter of ``net``.
    """
    weights = [1.0] * len(rows) if weights is None else list(weights)
    params = {n: p for n, p in net.named_parameters() if p.requires_grad}
    with torch.enable_grad():
        inner = 0.0
        for row, delta, w in zip(rows, deltas, weights):
            theta = net(row, list(delta))
            inner = inner + w * sum((theta[k] * delta[k].to(theta[k])).sum() for k in delta)
        grads = torch.autograd.grad(-inner, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g.detach() for (n, p), g in zip(params.items(), grads)}


def embedding_grad(net: HyperNetwork, v: torch.Tensor, names: Sequence[str], delta: Tensors) -> torch.Tensor:
    """Gradient of ``1/2 ||theta_tilde - h(v; phi)||^2`` with respect to ``v`` alone, phi frozen.

    ``theta_tilde = h(v; phi) + delta`` is held fixed, so this is ``-(d h / d v)^T delta``
    (sec. 3.2's update restricted to the embedding; sec. 5.3 freezes phi).
    """
    with torch.enable_grad():
        v = v.detach().clone().requires_grad_(True)
        theta = net.generate(v, names)
        inner = sum((theta[k] * delta[k].to(theta[k])).sum() for k in delta)
        (g,) = torch.autograd.grad(-inner, [v])
    return g.detach()


def _converged(trail: list[torch.Tensor], window: int, tol: float) -> tuple[bool, float]:
    """Drift of the last ``window`` iterates' mean from the previous window's, relative to max(1, ||v||).

    Comparing window means (not single steps) ignores the jitter of stochastic client
    answers around a fixed point but still sees a steady drift.
    """
    if len(trail) < 2 * window + 1:
        return False, math.inf
    recent = torch.stack(trail[-window:]).mean(0)
    before = torch.stack(trail[-2 * window:-window]).mean(0)
    drift = float((recent - before).norm()) / max(1.0, float(recent.norm()))
    return drift <= tol, drift


def fit_embedding(net: HyperNetwork, v0: torch.Tensor, names: Sequence[str], answer, *, lr: float,
                  momentum: float = 0.0, weight_decay: float = 0.0, max_grad_norm: float = 0.0,
                  max_steps: int = 1000, tol: float = 0.0, window: int = 10) -> tuple[torch.Tensor, dict]:
    """Optimize one embedding through a frozen hypernetwork (pFedHN sec. 5.3, novel clients).

    Each step sends ``theta = h(v; phi)`` to the client, which answers ``delta theta``
    (``answer(theta, step) -> {name: tensor}``, e.g. K local SGD steps); ``v`` then takes
    one SGD step (torch's rule: weight decay, momentum) on `embedding_grad`, the gradient
    clipped at ``max_grad_norm`` (0: none). Stops after ``max_steps`` steps, or earlier
    when the mean of the last ``window`` iterates moved by at most ``tol * max(1, ||v||)``
    from the mean of the ``window`` before them (``tol = 0``: never early).

    Returns:
        The fitted embedding and ``{"steps", "converged", "drift"}``.
    """
    v = v0.detach().clone()
    buf: torch.Tensor | None = None
    trail = [v.clone()]
    done, drift, step = False, math.inf, 0
    for step in range(1, max_steps + 1):
        with torch.no_grad():
            theta = {k: t.detach().clone() for k, t in net.generate(v, names).items()}
        g = embedding_grad(net, v, names, answer(theta, step - 1))
        g = clip_grad_norm({"v": g}, max_grad_norm)["v"]
        if weight_decay:
            g = g + weight_decay * v
        if momentum:
            buf = g if buf is None else momentum * buf + g
            g = buf
        v = v - lr * g
        trail = (trail + [v.clone()])[-(2 * window + 1):]
        done, drift = _converged(trail, window, tol) if tol > 0 else (False, math.inf)
        if done:
            break
    return v, {"steps": step, "converged": bool(done), "drift": drift}


def clip_grad_norm(grads: Tensors, max_norm: float) -> Tensors:
    """Scale ``grads`` to global L2 norm at most ``max_norm`` (0: unchanged); torch's rule."""
    if max_norm <= 0:
        return grads
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    scale = min(1.0, max_norm / (float(total) + 1e-6))
    return {k: g * scale for k, g in grads.items()} if scale < 1.0 else grads


def server_step(params: Tensors, grads: Tensors, opt: dict, *, kind: str, lr: Mapping[str, float] | float,
                momentum: float = 0.0, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8
                ) -> tuple[Tensors, dict]:
    """One step of SGD (torch.optim.SGD's rule) or Adam on a dict of tensors; pure.

    Args:
        params, grads: ``{name: tensor}``; names missing from ``grads`` are left as they are.
        opt: optimizer state ``{"step": int, "m": {...}, "v": {...}}`` (empty dict at first).
        kind: ``"sgd"`` or ``"adam"``.
        lr: one rate, or ``{name: rate}`` (pFedHN's separate embedding rate).

    Returns:
        New parameters and new optimizer state (inputs are not modified).
    """
    step = int(opt.get("step", 0)) + 1
    m_in, v_in = opt.get("m", {}), opt.get("v", {})
    new_p, m_out, v_out = dict(params), dict(m_in), dict(v_in)
    for name, g in grads.items():
        p = params[name]
        rate = lr[name] if isinstance(lr, Mapping) else lr
        if weight_decay:
            g = g + weight_decay * p
        if kind == "sgd":
            if momentum:
                g = g if name not in m_in else momentum * m_in[name] + g
                m_out[name] = g
            new_p[name] = p - rate * g
        elif kind == "adam":
            m = (1 - betas[0]) * g + (betas[0] * m_in[name] if name in m_in else 0.0)
            v = (1 - betas[1]) * g * g + (betas[1] * v_in[name] if name in v_in else 0.0)
            m_out[name], v_out[name] = m, v
            m_hat, v_hat = m / (1 - betas[0] ** step), v / (1 - betas[1] ** step)
            new_p[name] = p - rate * m_hat / (v_hat.sqrt() + eps)
        else:
            raise ValueError(f"server optimizer {kind!r}: use 'sgd' or 'adam'")
    return new_p, {"step": step, "m": m_out, "v": v_out}
