"""Pure-PyTorch reference implementations of pflkit's custom ops.

Every op here has the exact signature of its Triton twin; the dispatcher in
`pflkit.kernels` picks one of them. These references run everywhere (CPU, MPS,
CUDA without Triton), are differentiable to any order by autograd, and are what
the Triton kernels are tested against.

The ops (FedL2P, NeurIPS 2023):

* ``mixed_batch_norm(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias,
  training, momentum=0.1, eps=1e-5, mode="mixed") -> Tensor``: batch norm with the
  beta-mixed statistics of Eq. 2 (FT BN C / G / I are its special cases).
* ``neumann_update(v, hv, p, psi) -> (v_new, p_new)``: lines 3-4 of Alg. 2 over lists of
  tensors, ``v_new = v - psi * hv``, ``p_new = p + v_new``. Out of place: the inputs are
  left untouched and two new lists are returned (p is computed in v's dtype). Not meant to
  be differentiated (Alg. 2 runs on detached vectors).
* ``layerwise_sgd_step(params, grads, eta, max_lr=None) -> list[Tensor]``: Eq. 10,
  ``theta'_l = theta_l - e_l * g_l`` with one learning rate per tensor, ``eta`` a 1-D tensor
  with one entry per tensor and ``e = clamp(eta, 0, max_lr)`` in the forward pass only
  (straight-through: the gradient reaches ``eta`` unchanged; ``max_lr=None``: no clamp).
  Differentiable w.r.t. params, grads and eta, to any order.
"""
from __future__ import annotations

import torch

BN_MODES = ("mixed", "batch")


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def mixed_batch_norm(
    x: torch.Tensor,
    pt_mean: torch.Tensor,
    pt_var: torch.Tensor,
    client_mean: torch.Tensor | None,
    client_var: torch.Tensor | None,
    beta: float | torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    mode: str = "mixed",
) -> torch.Tensor:
    """Batch norm with beta-mixed statistics (FedL2P Eq. 1-2).

    ``mode="mixed"`` (Eq. 2): the layer normalizes with
    ``mu = (1 - beta) * pt_mean + beta * mu_c`` and
    ``var = (1 - beta) * pt_var + beta * var_c``, where ``(mu_c, var_c)`` are the
    current batch's statistics (biased variance) when ``training`` and the client's
    running estimates ``(client_mean, client_var)`` otherwise. In training the client's
    running estimates are updated in place from the batch (unbiased variance, the given
    momentum), as `torch.nn.BatchNorm2d` does. ``beta = 0`` is FT (BN G): the pretrained
    statistics, no batch dependence; ``beta = 1`` is FT (BN C): the client's statistics.

    ``mode="batch"`` is FT (BN I): the incoming batch's statistics in training and in
    evaluation; no running estimate is read or written, and ``beta`` is ignored.

    Gradient of beta (what trains BNNet through L_V): with ``r = (var + eps)^-1/2``,
    ``dL/dbeta = dL/dmu (mu_c - pt_mean) + dL/dvar (var_c - pt_var)``, where
    ``dL/dmu = -r sum(dL/dy gamma)`` and ``dL/dvar = -r^3 / 2 sum(dL/dy gamma (x - mu))``
    (sums over all but the channel axis; a scalar beta sums over channels too). In
    evaluation it flows through the running-statistics mixture (``mu_c`` = client_mean).

    Arithmetic is fp32 for fp16 / bf16 / fp32 activations and float64 for float64 ones.

    Args:
        x: activations (N, C, *), any memory format.
        pt_mean, pt_var: the pretrained model's running statistics, shape (C,).
        client_mean, client_var: the client's running statistics (C,), updated in place
            in training; may be None in ``mode="batch"`` and in training (then nothing is
            updated), not in evaluation with ``mode="mixed"``.
        beta: a float, a 0-d tensor or a (C,) tensor in [0, 1]; differentiable.
        weight, bias: gamma and delta of Eq. 1, shape (C,), or None.
        training: use batch statistics (and update the client's running ones).
        momentum: weight of the new batch in the running-statistics update.
        eps: added to the variance.
        mode: ``"mixed"`` or ``"batch"``.

    Returns:
        The normalized, scaled and shifted activations, same shape and dtype as ``x``.
    """
    check_mixed_batch_norm_args(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias, training, mode)
    dims = [0] + list(range(2, x.dim()))
    # fp32 accumulation for fp16/bf16/fp32 activations; float64 stays float64 (gradcheck).
    cdt = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(cdt)
    if mode == "batch" or training:
        batch_mean = xf.mean(dim=dims)
        batch_var = xf.var(dim=dims, unbiased=False)
    if mode == "batch":
        mean, var = batch_mean, batch_var
    else:
        if training:
            if client_mean is not None:
                n = xf.numel() // xf.shape[1]
                with torch.no_grad():
                    unbiased = batch_var * (n / max(n - 1, 1))
                    client_mean.mul_(1 - momentum).add_(batch_mean.detach().to(client_mean.dtype), alpha=momentum)
                    client_var.mul_(1 - momentum).add_(unbiased.detach().to(client_var.dtype), alpha=momentum)
            cur_mean, cur_var = batch_mean, batch_var
        else:
            cur_mean, cur_var = client_mean.to(cdt), client_var.to(cdt)
        b = beta if isinstance(beta, torch.Tensor) else torch.tensor(float(beta), device=x.device)
        b = b.to(cdt)
        mean = (1 - b) * pt_mean.to(cdt) + b * cur_mean
        var = (1 - b) * pt_var.to(cdt) + b * cur_var
    y = (xf - _channel_view(mean, x.dim())) * _channel_view(torch.rsqrt(var + eps), x.dim())
    if weight is not None:
        y = y * _channel_view(weight.to(cdt), x.dim())
    if bias is not None:
        y = y + _channel_view(bias.to(cdt), x.dim())
    return y.to(x.dtype)


def check_mixed_batch_norm_args(x, pt_mean, pt_var, client_mean, client_var, beta, weight, bias, training, mode):
    """Raise a ValueError naming the first bad argument of `mixed_batch_norm`."""
    if mode not in BN_MODES:
        raise ValueError(f"mixed_batch_norm: mode must be one of {BN_MODES}, got {mode!r}")
    if x.dim() < 2:
        raise ValueError(f"mixed_batch_norm: x must be (N, C, *), got shape {tuple(x.shape)}")
    C = x.shape[1]
    named = {"pt_mean": pt_mean, "pt_var": pt_var, "client_mean": client_mean, "client_var": client_var,
             "weight": weight, "bias": bias}
    for name, t in named.items():
        if t is not None and t.shape != (C,):
            raise ValueError(f"mixed_batch_norm: {name} must have shape ({C},), got {tuple(t.shape)}")
    if mode == "mixed":
        if pt_mean is None or pt_var is None:
            raise ValueError("mixed_batch_norm: mode='mixed' needs pt_mean and pt_var")
        if not training and (client_mean is None or client_var is None):
            raise ValueError("mixed_batch_norm: mode='mixed' in evaluation needs client_mean and client_var")
        if (client_mean is None) != (client_var is None):
            raise ValueError("mixed_batch_norm: client_mean and client_var must both be given or both be None")
        if isinstance(beta, torch.Tensor) and (beta.dim() > 1 or beta.numel() not in (1, C)):
            raise ValueError(f"mixed_batch_norm: beta must be a scalar or have {C} entries, got shape "
                             f"{tuple(beta.shape)}")


def neumann_update(v, hv, p, psi: float):
    """One Neumann-series step of the IFT hypergradient (FedL2P Alg. 2, lines 3-4).

    ``v_new = v - psi * hv`` and ``p_new = p + v_new`` for every tensor of the lists, where
    ``hv`` is the Hessian-vector product ``v d^2_theta L_T`` of the current ``v``. After Q
    steps from ``p = v = d_theta L_V``, ``p = sum_{j<=Q} (I - psi H)^j v`` approximates
    ``v H^-1 / psi`` (Eq. 7). Out of place: the inputs are not modified.

    Args:
        v, hv, p: equal-length lists of tensors, the i-th of each with the same shape.
        psi: the step size of the series (FedL2P: 0.1).

    Returns:
        ``(v_new, p_new)``: two new lists; ``p_new[i]`` has ``v[i]``'s dtype.
    """
    v, hv, p = list(v), list(hv), list(p)
    check_neumann_args(v, hv, p)
    v_new = [torch.add(vi, hi.to(vi.dtype), alpha=-float(psi)) for vi, hi in zip(v, hv)]
    p_new = [pi.to(vi.dtype) + vi for pi, vi in zip(p, v_new)]
    return v_new, p_new


def check_neumann_args(v, hv, p) -> None:
    """Raise a ValueError naming the first mismatch between the lists of `neumann_update`."""
    if not (len(v) == len(hv) == len(p)):
        raise ValueError(f"neumann_update: v, hv, p must have equal lengths, got {len(v)}, {len(hv)}, {len(p)}")
    for i, (a, b, c) in enumerate(zip(v, hv, p)):
        if not (a.shape == b.shape == c.shape):
            raise ValueError(f"neumann_update: tensor {i} shapes differ: v {tuple(a.shape)}, "
                             f"hv {tuple(b.shape)}, p {tuple(c.shape)}")


def clamp_ste(eta: torch.Tensor, max_lr: float | None) -> torch.Tensor:
    """``clamp(eta, 0, max_lr)`` forward, identity backward (straight-through, FedL2P App. E)."""
    if max_lr is None:
        return eta
    return eta + (eta.clamp(0.0, float(max_lr)) - eta).detach()


def layerwise_sgd_step(params, grads, eta: torch.Tensor, max_lr: float | None = None) -> list[torch.Tensor]:
    """One SGD step with a learning rate per tensor (FedL2P Eq. 10).

    ``theta'_l = theta_l - e_l * g_l`` with ``e = clamp(eta, 0, max_lr)`` in the forward pass;
    the backward treats the clamp as the identity (straight-through estimator, App. E), so
    ``dL/deta_l = -<dL/dtheta'_l, g_l>`` even where the clamp is active. Differentiable w.r.t.
    ``params``, ``grads`` (pass grads made with ``create_graph=True`` for the second-order
    terms of Eq. 9) and ``eta``.

    Args:
        params: list of L tensors theta_l.
        grads: list of L tensors g_l, shaped like ``params``.
        eta: 1-D tensor of L learning rates (LRNet output times the post-multiplier).
        max_lr: upper clamp bound; ``None`` disables the clamp (negative rates pass through).

    Returns:
        The list of updated tensors theta'_l (new tensors, in each param's dtype; computed in
        at least fp32).
    """
    params, grads = list(params), list(grads)
    check_sgd_args(params, grads, eta)
    e = clamp_ste(eta, max_lr)
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        # fp32 arithmetic for half tensors (and so fp32 sums in the gradient of eta)
        cdt = torch.promote_types(p.dtype, torch.float32)
        out.append((p.to(cdt) - e[i].to(cdt) * g.to(cdt)).to(p.dtype))
    return out


def check_sgd_args(params, grads, eta) -> None:
    """Raise a ValueError naming the first bad argument of `layerwise_sgd_step`."""
    if len(params) != len(grads):
        raise ValueError(f"layerwise_sgd_step: {len(params)} params but {len(grads)} grads")
    if not isinstance(eta, torch.Tensor) or eta.dim() != 1 or eta.numel() != len(params):
        got = tuple(eta.shape) if isinstance(eta, torch.Tensor) else type(eta).__name__
        raise ValueError(f"layerwise_sgd_step: eta must be a 1-D tensor with one entry per tensor "
                         f"({len(params)}), got {got}")
    for i, (p, g) in enumerate(zip(params, grads)):
        if p.shape != g.shape:
            raise ValueError(f"layerwise_sgd_step: tensor {i}: param {tuple(p.shape)} vs grad {tuple(g.shape)}")
