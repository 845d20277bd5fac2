"""2-D convolution whose second derivative runs on the backward kernels (cheaper Hessian-vector products).

FedL2P's IFT hypergradient (Eq. 6-7, Alg. 2) differentiates the gradient ``d_theta L_T``
three times for the Neumann series and once more for the mixed product. Each of those
passes meets, at every convolution ``y = conv(x, w)``, the node of its backward
``(gx, gw) = (conv^T(gy, w), wgrad(x, gy))`` and must return, for cotangents
``(u_x, u_w)`` on ``(gx, gw)``:

    d/d gy = conv(u_x, w) + conv(x, u_w) (+ u_b broadcast, with a bias)
    d/d x  = conv^T(gy, u_w)        (the input gradient of a convolution with weight u_w)
    d/d w  = wgrad(u_x, gy)         (the weight gradient of a convolution of u_x)

These are the same four convolutions as autograd's built-in double backward, which however
computes ``d/d w`` as a convolution of the transposed tensors (batch and channels swapped,
the output's spatial size as kernel): a shape the CPU (oneDNN) kernels run slowly. Here
``d/d x`` and ``d/d w`` go through ``aten.convolution_backward``, the kernels a plain backward
uses, on CPU and CUDA alike. The values agree with autograd's to float rounding
(tests/meta/test_conv_hvp.py); the derivatives of this backward are themselves ordinary
differentiable ops, so still higher orders stay correct.

`cheap_conv_double_backward` routes ``torch.nn.functional.conv2d`` calls made inside it
(``nn.Conv2d`` included) through this convolution; anything it does not cover (string
padding, autocast, a torch.func transform) runs the ordinary op.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["conv2d", "cheap_conv_double_backward"]


def _pair(v) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(t) for t in v]


def _conv_backward(gy, x, w, bias_numel: int | None, geom, mask) -> tuple:
    """``aten.convolution_backward``: (d x, d w, d b) of a convolution with upstream ``gy``."""
    stride, padding, dilation, groups = geom
    sizes = [bias_numel] if bias_numel is not None else None
    return torch.ops.aten.convolution_backward(gy, x, w, sizes, stride, padding, dilation, False, [0, 0],
                                               groups, list(mask))


def _sum_like(like: torch.Tensor, terms: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``terms`` broadcast to ``like``'s shape (zeros when there is none)."""
    if not terms:
        return torch.zeros_like(like)
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out if out.shape == like.shape else out.expand_as(like)


class _ConvGrad(torch.autograd.Function):
    """``(gy, x, w) -> (gx, gw, gb)``: a convolution's backward, differentiable (module docstring)."""

    @staticmethod
    def forward(ctx, gy, x, w, bias_numel, geom, mask):
        ctx.save_for_backward(gy, x, w)
        ctx.bias_numel, ctx.geom = bias_numel, geom
        gx, gw, gb = _conv_backward(gy, x, w, bias_numel, geom, mask)
        return gx, gw, gb

    @staticmethod
    def backward(ctx, ux, uw, ub):
        gy, x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geom
        need_gy, need_x, need_w = ctx.needs_input_grad[:3]
        d_gy = d_x = d_w = None
        if need_gy:  # <(gx, gw, gb), (ux, uw, ub)> is linear in gy: the forward convolutions
            terms = [F.conv2d(ux, w, None, stride, padding, dilation, groups) if ux is not None else None,
                     F.conv2d(x, uw, None, stride, padding, dilation, groups) if uw is not None else None,
                     ub.reshape(1, -1, 1, 1) if ub is not None else None]
            d_gy = _sum_like(gy, [t for t in terms if t is not None])
        if need_x and uw is not None:  # <wgrad(x, gy), uw> is linear in x: the input gradient for weight uw
            d_x = _conv_backward(gy, x, uw, None, ctx.geom, (True, False, False))[0]
        if need_w and ux is not None:  # <conv^T(gy, w), ux> is linear in w: the weight gradient of input ux
            d_w = _conv_backward(gy, ux, w, None, ctx.geom, (False, True, False))[1]
        return d_gy, d_x, d_w, None, None, None


class _Conv(torch.autograd.Function):
    """``conv2d(x, w, b)`` whose backward is `_ConvGrad` (a differentiable node)."""

    @staticmethod
    def forward(ctx, x, w, b, geom):
        ctx.save_for_backward(x, w)
        ctx.geom, ctx.bias_numel = geom, (None if b is None else b.numel())
        stride, padding, dilation, groups = geom
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        gx, gw, gb = _ConvGrad.apply(gy, x, w, ctx.bias_numel, ctx.geom, mask)
        return gx, gw, gb, None


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """``F.conv2d`` with the backward-kernel double backward (module docstring); batched 4-D input."""
    geom = (_pair(stride), _pair(padding), _pair(dilation), int(groups))
    return _Conv.apply(x, w, b, geom)


def _covered(args, kwargs) -> bool:
    """Whether `conv2d` takes this ``F.conv2d`` call (else the ordinary op runs)."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    bound = dict(zip(names, args), **kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4):
        return False
    if isinstance(bound.get("padding", 0), str) or torch.is_autocast_enabled():
        return False
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return not (wrapped is not None and wrapped(x))


class _Route(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.conv2d and torch.is_grad_enabled() and _covered(args, kwargs):
            return conv2d(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cheap_conv_double_backward(enabled: bool = True):
    """Inside: ``F.conv2d`` builds `conv2d` nodes (same values, cheaper second derivatives)."""
    if not enabled:
        yield
        return
    with _Route():
        yield
