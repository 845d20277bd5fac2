"""mixed_batch_norm (FedL2P Eq. 1-2): the reference against definitions and torch's batch
norm, and the Triton kernel (CPU interpreter) against the reference on awkward shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import DEVICE, assert_close, requires_triton

from pflkit.kernels import mixed_bn_triton, reference

IMPLS = {"reference": reference.mixed_batch_norm, "triton": mixed_bn_triton.mixed_batch_norm}
BOTH = ["reference", pytest.param("triton", marks=requires_triton)]


def _stats(C, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    pm, cm = torch.randn(C, generator=g), torch.randn(C, generator=g)
    pv, cv = torch.rand(C, generator=g) + 0.5, torch.rand(C, generator=g) + 0.5
    return [t.to(DEVICE, dtype) for t in (pm, pv, cm, cv)]


def _inputs(shape, dtype=torch.float32, seed=0, layout="contiguous"):
    g = torch.Generator().manual_seed(seed)
    C = shape[1]
    x = (torch.randn(shape, generator=g) * 1.5 + 0.7).to(DEVICE, dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "permuted":  # spatial dims that cannot be merged into one stride
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    # gamma / delta stay fp32 for half activations (as under autocast); float64 for gradcheck
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    w, b = (torch.randn(C, generator=g) + 1.0).to(DEVICE, pdt), torch.randn(C, generator=g).to(DEVICE, pdt)
    dy = torch.randn(shape, generator=g).to(DEVICE, dtype)
    return x, w, b, dy


def _run(fn, x, stats, beta, w, b, dy, training, mode, momentum=0.1):
    """Output, gradients (x, w, b, beta) and the client stats after one call."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    b = b.detach().clone().requires_grad_()
    beta = beta.detach().clone().requires_grad_() if isinstance(beta, torch.Tensor) else beta
    pm, pv, cm, cv = (t.clone() if t is not None else None for t in stats)
    y = fn(x, pm, pv, cm, cv, beta, w, b, training, momentum, 1e-5, mode)
    y.backward(dy)
    g_beta = beta.grad if isinstance(beta, torch.Tensor) else None
    return {"y": y, "dx": x.grad, "dw": w.grad, "db": b.grad, "dbeta": g_beta, "client_mean": cm, "client_var": cv}


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("training,mode,beta_kind", [
    (True, "mixed", "vector"), (False, "mixed", "scalar"), (True, "batch", "none"), (False, "batch", "none")])
def test_reference_gradcheck_float64(training, mode, beta_kind):
    x, w, b, _ = _inputs((3, 2, 3, 2), torch.float64)
    pm, pv, cm, cv = _stats(2, dtype=torch.float64)
    beta = {"vector": torch.tensor([0.3, 0.8]), "scalar": torch.tensor(0.4), "none": torch.tensor(0.5)}[beta_kind]
    beta = beta.to(DEVICE, torch.float64).requires_grad_(beta_kind != "none")
    inputs = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), beta)
    # In training the client statistics are not read; pass None so repeated calls do not update them.
    client = (None, None) if training else (cm, cv)

    def f(x_, w_, b_, beta_):
        return reference.mixed_batch_norm(x_, pm, pv, *client, beta_, w_, b_, training, 0.1, 1e-5, mode)

    assert torch.autograd.gradcheck(f, inputs)
    if training and mode == "mixed":
        assert torch.autograd.gradgradcheck(f, inputs)


def test_reference_running_update_matches_torch_batchnorm():
    x, _, _, _ = _inputs((4, 3, 5, 2))
    pm, pv, cm, cv = _stats(3)
    bn = torch.nn.BatchNorm2d(3, momentum=0.3).to(DEVICE)
    bn.running_mean.copy_(cm)
    bn.running_var.copy_(cv)
    bn.train()(x)
    reference.mixed_batch_norm(x, pm, pv, cm, cv, 0.5, None, None, True, 0.3)
    torch.testing.assert_close(cm, bn.running_mean)
    torch.testing.assert_close(cv, bn.running_var)


def test_reference_beta_gradient_by_hand():
    """d y / d beta in evaluation: only through mu and var of Eq. 2 (no batch statistics)."""
    x, _, _, _ = _inputs((2, 1, 3), torch.float64)
    pm, pv, cm, cv = (torch.tensor([v], dtype=torch.float64, device=DEVICE) for v in (0.2, 1.5, -0.4, 0.6))
    beta = torch.tensor(0.25, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = reference.mixed_batch_norm(x, pm, pv, cm, cv, beta, None, None, False)
    y.sum().backward()
    mu, var = 0.75 * 0.2 + 0.25 * -0.4, 0.75 * 1.5 + 0.25 * 0.6
    r = (var + 1e-5) ** -0.5
    # y = (x - mu) r:  dy/dmu = -r,  dy/dvar = -(x - mu) r^3 / 2;  dmu/dbeta = cm - pm, dvar/dbeta = cv - pv
    expected = (-r * (-0.4 - 0.2) - 0.5 * (x - mu) * r**3 * (0.6 - 1.5)).sum()
    torch.testing.assert_close(beta.grad, expected)


@pytest.mark.parametrize("bad,match", [
    (dict(mode="other"), "mode must be one of"),
    (dict(x=torch.randn(5)), "x must be"),
    (dict(pt_mean=torch.zeros(4)), "pt_mean must have shape"),
    (dict(client_mean=None, client_var=None, training=False), "needs client_mean"),
    (dict(beta=torch.ones(2)), "beta must be a scalar"),
])
def test_bad_arguments_raise_clear_errors(bad, match):
    args = dict(x=torch.randn(2, 3, 4), pt_mean=torch.zeros(3), pt_var=torch.ones(3), client_mean=torch.zeros(3),
                client_var=torch.ones(3), beta=0.5, weight=None, bias=None, training=True, mode="mixed")
    # argument checks come first, so the Triton twin raises the same errors without Triton
    args.update(bad)
    for fn in IMPLS.values():
        with pytest.raises(ValueError, match=match):
            fn(**args)


# ----------------------------------------------- beta = 0 / 1 and batch mode = torch batch_norm


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("case", ["beta0_train", "beta0_eval", "beta1_train", "beta1_eval", "batch_eval"])
def test_special_cases_equal_torch_batch_norm(impl, case, tol):
    """FT (BN G) = pretrained stats, FT (BN C) = client stats / batch stats, FT (BN I) = batch stats."""
    fn = IMPLS[impl]
    x, w, b, dy = _inputs((3, 4, 5, 3))
    stats = _stats(4)
    training = case.endswith("train")
    beta = 0.0 if case.startswith("beta0") else 1.0
    mode = "batch" if case.startswith("batch") else "mixed"
    got = _run(fn, x, stats, torch.tensor(beta, device=DEVICE), w, b, dy, training, mode, momentum=0.2)
    pm, pv, cm, cv = (t.clone() for t in stats)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    if beta == 0.0:
        want = F.batch_norm(xr, pm, pv, wr, br, training=False, eps=1e-5)
    elif mode == "batch":
        want = F.batch_norm(xr, None, None, wr, br, training=True, eps=1e-5)
    else:  # beta = 1: batch statistics and the running update in training, client stats in evaluation
        want = F.batch_norm(xr, cm, cv, wr, br, training=training, momentum=0.2, eps=1e-5)
    want.backward(dy)
    assert_close(got["y"], want, tol, "y")
    assert_close(got["dx"], xr.grad, tol, "dx")
    assert_close(got["dw"], wr.grad, tol, "dgamma")
    assert_close(got["db"], br.grad, tol, "ddelta")
    if mode == "mixed":  # the client's running stats follow the batch in training, whatever beta
        cm2, cv2 = stats[2].clone(), stats[3].clone()
        if training:
            F.batch_norm(x, cm2, cv2, training=True, momentum=0.2)
        assert_close(got["client_mean"], cm2, tol, "client running mean")
        assert_close(got["client_var"], cv2, tol, "client running var")


# ------------------------------------------------------------- Triton against the reference

MODES = {
    "train_mixed_vec": (True, "mixed", "vector"),
    "train_mixed_float": (True, "mixed", "float"),
    "eval_mixed_scalar": (False, "mixed", "scalar"),
    "train_batch": (True, "batch", "float"),
    "eval_batch": (False, "batch", "float"),
}
SHAPES = {
    "odd_NHW": (3, 3, 7, 5),        # N*H*W = 105, not a multiple of any block
    "batch1_C1": (1, 1, 5, 3),
    "C513": (2, 513, 1, 3),         # many channel blocks, 6 positions per channel
    "spatial_tiles": (2, 4, 17, 17),  # S = 289 >= 256: tiles along the spatial axis, padded
    "many_splits": (2, 2, 40, 40),  # 14 spatial tiles over 8 programs: Chan merges in and across programs
    "flat_splits": (64, 3, 5, 5),   # 4 flat tiles, the last partial
    "2d": (5, 6),
    "3d": (2, 3, 11),
}


def _beta(kind, C):
    if kind == "vector":
        return torch.linspace(0.1, 0.9, C, device=DEVICE)
    if kind == "scalar":
        return torch.tensor(0.35, device=DEVICE)
    return 0.6


PATHS = ["fused", "split"]


def force_path(monkeypatch, path):
    """Channels-first inputs take the fused kernels up to FUSED_MAX_M positions per channel and
    the split ones above; every shape here is small, so the split path is forced by a zero limit."""
    monkeypatch.setattr(mixed_bn_triton, "FUSED_MAX_M", 1 << 30 if path == "fused" else 0)


@requires_triton
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode_name", list(MODES))
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_triton_matches_reference_fp32(shape_name, mode_name, path, tol, monkeypatch):
    force_path(monkeypatch, path)
    _compare(SHAPES[shape_name], MODES[mode_name], torch.float32, "contiguous", tol)


@requires_triton
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape_name", ["odd_NHW", "C513", "spatial_tiles", "2d"])
@pytest.mark.parametrize("mode_name", ["train_mixed_vec", "eval_mixed_scalar"])
def test_triton_matches_reference_half(shape_name, dtype, mode_name, path, tol, monkeypatch):
    force_path(monkeypatch, path)
    _compare(SHAPES[shape_name], MODES[mode_name], dtype, "contiguous", tol)


def test_tiling_picks_the_fused_path_for_small_channels_first_inputs():
    """One launch each way for channels-first inputs with few positions per channel (ResNet-18's
    late stages at batch 32); the split kernels for large maps and for channels-last inputs."""
    def tiling(shape, channels_last=False):
        x = torch.empty(shape)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        _, strides = mixed_bn_triton._as_ncs(x)
        return mixed_bn_triton._Tiling(shape[0], shape[1], shape[2] * shape[3], strides, torch.device("cpu"))

    small, large, nhwc = tiling((32, 512, 7, 7)), tiling((32, 64, 56, 56)), tiling((32, 512, 7, 7), True)
    assert small.fused and not large.fused and not nhwc.fused
    assert large.spatial
    # every position of a channel block is visited once: tiles x block cover M
    assert small.n_tiles * small.block_m >= small.M > (small.n_tiles - 1) * small.block_m
    assert small.c_blocks * small.block_c >= 512


@requires_triton
@pytest.mark.parametrize("layout", ["channels_last", "permuted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode_name", ["train_mixed_vec", "eval_mixed_scalar", "train_batch"])
def test_triton_matches_reference_layouts(layout, dtype, mode_name, tol):
    _compare((3, 5, 4, 6), MODES[mode_name], dtype, layout, tol)


def _compare(shape, mode, dtype, layout, tol):
    training, bn_mode, beta_kind = mode
    x, w, b, dy = _inputs(shape, dtype, layout=layout)
    stats = _stats(shape[1])
    beta = _beta(beta_kind, shape[1])
    got = _run(mixed_bn_triton.mixed_batch_norm, x, stats, beta, w, b, dy, training, bn_mode)
    want = _run(reference.mixed_batch_norm, x, stats, beta, w, b, dy, training, bn_mode)
    for key in want:
        # gamma / delta / beta gradients are fp32 sums in both: compare them at fp32-level
        # tolerance scaled by the sum length; activations at the activation dtype's tolerance.
        key_dtype = dtype if key in ("y", "dx") else torch.float32
        loose = {k: {"atol": v["atol"] * 10, "rtol": v["rtol"] * 10} for k, v in tol.items()}
        assert_close(got[key], want[key], tol if key in ("y", "dx", "client_mean", "client_var") else loose,
                     key, key_dtype)
    if layout == "channels_last":
        assert got["y"].is_contiguous(memory_format=torch.channels_last)


@requires_triton
def test_triton_gradients_of_fp16_weight_and_beta_dtypes(tol):
    """Gradients come back in each input's own dtype."""
    x, w, b, dy = _inputs((2, 3, 4, 4), torch.float16)
    beta = torch.full((3,), 0.5, dtype=torch.float16, device=DEVICE, requires_grad=True)
    w16, b16 = w.half().requires_grad_(), b.half().requires_grad_()
    y = mixed_bn_triton.mixed_batch_norm(x, *_stats(3), beta, w16, b16, True)
    y.backward(dy)
    assert (beta.grad.dtype, w16.grad.dtype, b16.grad.dtype) == (torch.float16,) * 3


@requires_triton
def test_triton_large_mean_is_stable():
    """Chan-merged statistics keep the variance of data with mean 1e3 and std 1e-2."""
    g = torch.Generator().manual_seed(3)
    x = (1000.0 + 0.01 * torch.randn(4, 2, 33, 33, generator=g)).to(DEVICE)
    pm, pv, cm, cv = _stats(2)
    mixed_bn_triton.mixed_batch_norm(x, pm, pv, cm, cv, 1.0, None, None, True, momentum=1.0)
    truth = x.double().var(dim=(0, 2, 3))  # unbiased: what momentum = 1 stores
    torch.testing.assert_close(cv.double(), truth, rtol=2e-3, atol=0.0)


@requires_triton
def test_triton_double_backward_matches_reference():
    """Hessian-vector products (Alg. 2) through the op: the backward is re-derived differentiably."""
    x, w, b, _ = _inputs((2, 3, 4, 3), torch.float32)
    stats = _stats(3)
    results = []
    for fn in (reference.mixed_batch_norm, mixed_bn_triton.mixed_batch_norm):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        beta = torch.full((3,), 0.4, device=DEVICE, requires_grad=True)
        y = fn(xs, *[t.clone() for t in stats], beta, ws, b, True)
        loss = (y.sin() * torch.arange(y.numel(), device=DEVICE).reshape(y.shape) / y.numel()).sum()
        gx, gw = torch.autograd.grad(loss, (xs, ws), create_graph=True)
        hvp = torch.autograd.grad((gx * x.cos()).sum() + gw.sum(), (xs, ws, beta))
        results.append(hvp)
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@requires_triton
def test_triton_without_weight_bias_and_no_grad_inputs(tol):
    x, _, _, dy = _inputs((2, 3, 4, 5))
    stats = _stats(3)
    got = mixed_bn_triton.mixed_batch_norm(x, *stats, 0.3, None, None, False)
    want = reference.mixed_batch_norm(x, *stats, 0.3, None, None, False)
    assert_close(got, want, tol, "y")
    assert not got.requires_grad


@requires_triton
def test_triton_split_statistics_merge_across_finalize_blocks(monkeypatch, tol):
    """Many splits whose means differ (a ramp along the image), merged over several finalize
    steps: on a GPU hundreds of splits are normal, on this CPU the split count is forced up."""
    monkeypatch.setattr(mixed_bn_triton, "programs_target", lambda device: 64)
    monkeypatch.setattr(mixed_bn_triton, "FIN_BLOCK_S", 4)
    force_path(monkeypatch, "split")
    x, w, b, dy = _inputs((2, 2, 40, 40))
    x = x + torch.linspace(-3.0, 3.0, 1600, device=DEVICE).reshape(40, 40)
    stats = _stats(2)
    got = _run(mixed_bn_triton.mixed_batch_norm, x, stats, 0.7, w, b, dy, True, "mixed")
    want = _run(reference.mixed_batch_norm, x, stats, 0.7, w, b, dy, True, "mixed")
    for key in ("y", "dx", "client_mean", "client_var"):
        assert_close(got[key], want[key], tol, key)


@requires_triton
def test_triton_backward_of_a_sum_reads_an_expanded_gradient(tol):
    """``y.sum().backward()`` hands the op a stride-0 gradient; it is read in place."""
    x, w, b, _ = _inputs((2, 3, 4, 5))
    grads = []
    for fn in (reference.mixed_batch_norm, mixed_bn_triton.mixed_batch_norm):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        beta = torch.full((3,), 0.3, device=DEVICE, requires_grad=True)
        fn(xs, *_stats(3), beta, ws, b, True).sum().backward()
        grads.append((xs.grad, ws.grad, beta.grad))
    for got, want, name in zip(grads[1], grads[0], ("dx", "dgamma", "dbeta")):
        assert_close(got, want, tol, name)
