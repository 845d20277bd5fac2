"""The convolution with a backward-kernel double backward, and the IFT hypergradient built on it.

The new second derivative must equal autograd's own (float64, several geometries), pass a
numerical second-derivative check, and leave FedL2P's hypergradient (Alg. 2 and an exact
solve) unchanged on a small convolutional net with beta-mixed BN layers.
"""
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.meta.client_stats import client_stats
from pflkit.meta.conv_hvp import cheap_conv_double_backward, conv2d
from pflkit.meta.functional import forward, model_tensors
from pflkit.meta.hypergrad import ift_hypergrad
from pflkit.meta.objectives import meta_losses
from pflkit.meta.linear_solve import neumann
from pflkit.meta.metanets import MetaSpec, init_meta_params, meta_hyperparams
from pflkit.models.introspect import bn_modules, layer_input_modules, layer_param_names
from pflkit.models.mixed_bn import convert_bn

D = torch.float64

# (in channels, out channels, kernel, stride, padding, dilation, groups, bias, input needs grad)
GEOMETRIES = [
    (3, 4, (3, 3), 1, 1, 1, 1, False, True),
    (4, 6, (3, 2), 2, (1, 0), (1, 2), 2, True, True),
    (4, 4, (1, 1), 2, 0, 1, 4, True, False),   # depthwise 1x1, the input a constant (a first layer)
]


def _conv_problem(geom, seed=0):
    cin, cout, k, stride, pad, dil, groups, bias, x_grad = geom
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, cin, 7, 6, generator=g, dtype=D).requires_grad_(x_grad)
    w = torch.randn(cout, cin // groups, *k, generator=g, dtype=D, requires_grad=True)
    b = torch.randn(cout, generator=g, dtype=D, requires_grad=True) if bias else None
    return x, w, b, (stride, pad, dil, groups)


def _second_order(conv, x, w, b, args, seed=1):
    """First gradients and a Hessian-vector product of a non-linear loss of ``conv``."""
    ins = [t for t in (x, w, b) if t is not None and t.requires_grad]
    loss = (torch.tanh(conv(x, w, b, *args)) ** 2).sum()
    grads = torch.autograd.grad(loss, ins, create_graph=True)
    g = torch.Generator().manual_seed(seed)
    u = [torch.randn(t.shape, generator=g, dtype=D) for t in ins]
    return list(grads) + list(torch.autograd.grad(grads, ins, u))


@pytest.mark.parametrize("geom", GEOMETRIES)
def test_first_and_second_derivatives_match_autograd(geom, tol):
    x, w, b, args = _conv_problem(geom)
    want = _second_order(F.conv2d, x, w, b, args)
    got = _second_order(conv2d, x, w, b, args)
    assert len(got) == len(want)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **tol[D])
    assert all(float(e.detach().abs().max()) > 1e-3 for e in want)  # every comparison is informative


def test_a_frozen_weight_is_a_constant_of_both_derivatives(tol):
    x, w, b, args = _conv_problem(GEOMETRIES[1])
    w = w.detach()  # e.g. a layer whose learning rate is fixed at zero
    want = _second_order(F.conv2d, x, w, b, args)
    got = _second_order(conv2d, x, w, b, args)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, **tol[D])


@pytest.mark.parametrize("geom", GEOMETRIES[:2])
def test_second_derivative_passes_a_numerical_check(geom):
    x, w, b, (stride, pad, dil, groups) = _conv_problem(geom)
    x = x.detach()[:2, :, :5, :5].requires_grad_(True)
    w = w.detach().requires_grad_(True)
    inputs = (x, w) + ((b.detach().requires_grad_(True),) if b is not None else ())

    def fn(*t):
        return conv2d(t[0], t[1], t[2] if len(t) > 2 else None, stride, pad, dil, groups)

    assert torch.autograd.gradgradcheck(fn, inputs)


def test_the_context_routes_nn_conv2d_only_where_it_should():
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    x = torch.randn(2, 2, 5, 5, dtype=D)
    with cheap_conv_double_backward():
        routed = conv(x)
        with torch.no_grad():
            plain = conv(x)
        same = nn.Conv2d(2, 3, 3, padding="same").double()(x)
    assert type(routed.grad_fn).__name__ == "_ConvBackward"
    assert plain.grad_fn is None and type(same.grad_fn).__name__ != "_ConvBackward"
    torch.testing.assert_close(routed, conv(x), atol=0, rtol=0)
    with cheap_conv_double_backward(enabled=False):
        assert type(conv(x).grad_fn).__name__ != "_ConvBackward"


# --- FedL2P's hypergradient on a small convolutional net: new computation == old ---------------

class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.tanh(self.bn2(self.conv2(h)))
        return self.fc(h.flatten(1))


@pytest.fixture(scope="module", params=["last_step", "lookahead"])
def fedl2p_losses(request):
    """L_T, L_V, theta and lambda as a FedL2P client builds them: L_T through the last fine-tuning
    step (evaluation mode, the default) or an extra second-order look-ahead step (training mode,
    whose Hessian-vector products take third derivatives of the convolutions)."""
    torch.manual_seed(0)
    model = SmallConvNet().double()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    convert_bn(model)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(6, 2, 6, 6, generator=g, dtype=D) + 0.2 for _ in range(3)]
    ys = [torch.randint(0, 3, (6,), generator=g) for _ in range(3)]
    stats = client_stats(model, lambda: [xs[0]])
    params, buffers = model_tensors(model)
    names = list(params)
    spec = MetaSpec(num_bn=len(bn_modules(model)), num_layers=len(layer_input_modules(model)),
                    num_tensors=len(layer_param_names(model)), hidden=8, fixed_lr=0.1)
    nets = {k: v.double() for k, v in spec.modules().items()}
    lam = {k: v.double() for k, v in init_meta_params(spec, torch.Generator().manual_seed(2)).items()}
    keys = list(lam)

    def hyper(lm):
        return meta_hyperparams(spec, nets, dict(zip(keys, lm)), stats.xi.double(), stats.features.double())

    # the last fine-tuning step's gradient on the first batch (a constant of L_T)
    th0 = [p.detach().requires_grad_(True) for p in params.values()]
    with torch.no_grad():
        beta0 = hyper([lam[k] for k in keys])[0]
    copies = {n: b.clone() for n, b in buffers.items()}
    loss0 = F.cross_entropy(forward(model, dict(zip(names, th0)), copies, xs[0], beta=beta0, training=True), ys[0])
    grads = [t.detach() for t in torch.autograd.grad(loss0, th0)]
    train_loss, val_loss, _ = meta_losses(model, names, hyper, buffers, (xs[2], ys[2]), lt_mode=request.param,
                                          loss_b=(xs[1], ys[1]), step_b=(xs[0], ys[0]), grads=grads,
                                          second_order=request.param == "lookahead")
    return train_loss, val_loss, [p.detach() for p in params.values()], [lam[k] for k in keys]


@pytest.mark.parametrize("solve", [partial(neumann, steps=3, psi=0.1, scaled=False),
                                   partial(neumann, steps=20, psi=0.05)], ids=["alg2-q3", "q20"])
def test_ift_hypergradient_is_unchanged_by_the_cheap_convolution(fedl2p_losses, solve, tol):
    train_loss, val_loss, theta, lam = fedl2p_losses
    old = ift_hypergrad(train_loss, val_loss, theta, lam, solve=solve, cheap_conv=False)
    new = ift_hypergrad(train_loss, val_loss, theta, lam, solve=solve, cheap_conv=True)
    for a, e in zip(new, old):
        torch.testing.assert_close(a, e, **tol[D])
    # the implicit term (the part the convolution's second derivative enters) is not negligible
    direct = ift_hypergrad(train_loss, val_loss, theta, lam, solve=lambda mv, b: [torch.zeros_like(t) for t in b])
    gap = max(float((a - d).abs().max()) for a, d in zip(old, direct))
    assert gap > 1e-4 * max(float(a.abs().max()) for a in old)
