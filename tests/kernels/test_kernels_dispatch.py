"""The kernels dispatcher: the setting, the choice it makes per device, clean fallbacks."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from kernel_helpers import requires_cuda, requires_triton

from pflkit import kernels
from pflkit.kernels import mixed_bn_triton, neumann_triton, reference, sgd_triton


def _bn_args(device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g).to(device, dtype)
    stats = [torch.randn(3, generator=g).to(device) for _ in range(2)]
    return (x, stats[0], stats[1].abs() + 0.5, stats[0].clone(), stats[1].abs() + 0.5, 0.3, None, None, True)


def _call_all_ops(device="cpu"):
    """Run each public op once through the dispatcher."""
    kernels.mixed_batch_norm(*_bn_args(device))
    t = [torch.ones(3, device=device)]
    kernels.neumann_update(t, t, t, 0.1)
    kernels.layerwise_sgd_step(t, t, torch.ones(1, device=device))


@pytest.fixture
def spy(monkeypatch):
    """Record calls of the Triton twins (still running them)."""
    calls = []
    for module, name in [(mixed_bn_triton, "mixed_batch_norm"), (neumann_triton, "neumann_update"),
                         (sgd_triton, "layerwise_sgd_step")]:
        original = getattr(module, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)
    return calls


def test_setting_is_validated_with_a_clear_error():
    for bad in ("gpu", "Triton", None, 1):
        with pytest.raises(ValueError, match="kernels backend must be one of"):
            kernels.set_backend(bad)
    kernels.set_backend("reference")
    assert kernels.get_backend() == "reference"


def test_environment_variable_gives_the_initial_setting(monkeypatch):
    monkeypatch.setenv(kernels.ENV_VAR, " Reference ")
    assert kernels._initial_backend() == "reference"
    monkeypatch.setenv(kernels.ENV_VAR, "")
    assert kernels._initial_backend() == "auto"
    monkeypatch.setenv(kernels.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="PFLKIT_KERNELS must be one of .* got 'cuda'"):
        kernels._initial_backend()


def test_use_backend_restores_the_previous_setting_even_on_error():
    kernels.set_backend("auto")
    with pytest.raises(RuntimeError):
        with kernels.use_backend("reference"):
            assert kernels.get_backend() == "reference"
            raise RuntimeError("inside")
    assert kernels.get_backend() == "auto"


def test_auto_uses_the_reference_for_cpu_tensors(spy):
    kernels.set_backend("auto")
    _call_all_ops()
    assert spy == []
    assert {kernels.resolve(op, "cpu") for op in kernels.OPS} == {"reference"}


def test_reference_setting_never_touches_triton(spy):
    kernels.set_backend("reference")
    _call_all_ops()
    assert spy == [] and kernels.resolve("mixed_batch_norm", "cuda") == "reference"


@requires_triton
def test_triton_setting_runs_cpu_tensors_in_the_interpreter(spy, tol):
    kernels.set_backend("triton")
    args = _bn_args()
    got = kernels.mixed_batch_norm(*args)
    _call_all_ops()
    assert spy == ["mixed_batch_norm", "mixed_batch_norm", "neumann_update", "layerwise_sgd_step"]
    want = reference.mixed_batch_norm(*_bn_args())
    torch.testing.assert_close(got, want, **tol[torch.float32])


@requires_triton
def test_a_graph_differentiated_twice_records_the_reference_batch_norm(spy, monkeypatch):
    """Inside `differentiated_twice` (with grad on) the mixed BN is the reference op whatever the
    setting; outside the block, or without grad, the Triton op runs as before; and
    `ift_hypergrad` builds d_theta L_T inside the block."""
    from pflkit.meta import hypergrad

    kernels.set_backend("triton")
    x = _bn_args()[0].requires_grad_(True)
    with kernels.differentiated_twice():
        kernels.mixed_batch_norm(x, *_bn_args()[1:])
        with torch.no_grad():
            kernels.mixed_batch_norm(*_bn_args())
    assert spy == ["mixed_batch_norm"]  # the no-grad call only
    kernels.mixed_batch_norm(x, *_bn_args()[1:])
    assert spy == ["mixed_batch_norm", "mixed_batch_norm"]

    seen = []

    def train_loss(theta, lam):
        seen.append(kernels._twice.get())
        return (theta[0] * lam[0]).pow(2).sum()

    def val_loss(theta, lam):
        seen.append(kernels._twice.get())
        return (theta[0] - lam[0]).pow(2).sum()

    hypergrad.ift_hypergrad(train_loss, val_loss, [torch.ones(2)], [torch.ones(2)],
                            solve=lambda matvec, b: b, cheap_conv=False)
    assert seen == [False, True]  # L_V first, outside; then L_T, inside

    def loss(theta):
        seen.append(kernels._twice.get())
        return theta[0].pow(3).sum()

    seen.clear()
    hypergrad.maml_direction(loss, loss, [torch.ones(2)], alpha=0.1, hessian="exact")
    assert seen == [False, False, True]  # inner and outer losses outside, the Hessian's loss inside


def test_triton_setting_without_cuda_or_interpreter_raises(monkeypatch, spy):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernels.set_backend("triton")
    with pytest.raises(RuntimeError, match="need CUDA .*TRITON_INTERPRET=1|not importable"):
        kernels.mixed_batch_norm(*_bn_args())
    with pytest.raises(RuntimeError, match="kernels backend 'triton'"):
        kernels.resolve("neumann_update", "cpu")
    assert spy == []


@requires_triton
def test_triton_setting_rejects_inputs_the_kernel_does_not_take():
    kernels.set_backend("triton")
    with pytest.raises(RuntimeError, match="float64"):
        kernels.mixed_batch_norm(*_bn_args(dtype=torch.float64))
    t = [torch.ones(2, requires_grad=True)]
    with pytest.raises(RuntimeError, match="not differentiable"):
        kernels.neumann_update(t, t, t, 0.1)


def test_missing_triton_falls_back_cleanly(monkeypatch, spy):
    monkeypatch.setattr(kernels, "triton_importable", lambda: False)
    kernels.set_backend("auto")
    _call_all_ops()
    assert spy == [] and not kernels.is_available()
    kernels.set_backend("triton")
    with pytest.raises(RuntimeError, match="not importable"):
        kernels.mixed_batch_norm(*_bn_args())


def test_without_triton_installed_in_a_fresh_process():
    """``import triton`` failing: pflkit imports, auto computes with the reference, triton errors."""
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None          # makes `import triton` raise ImportError
        import torch
        from pflkit import kernels
        assert not kernels.triton_importable() and not kernels.is_available()
        x = torch.randn(4, 2, 3)
        y = kernels.mixed_batch_norm(x, torch.zeros(2), torch.ones(2), None, None, 1.0, None, None, True)
        assert torch.allclose(y.mean(dim=(0, 2)), torch.zeros(2), atol=1e-5)
        kernels.set_backend("triton")
        try:
            kernels.neumann_update([x], [x], [x], 0.1)
        except RuntimeError as e:
            assert "not importable" in str(e), e
        else:
            raise AssertionError("no error")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@requires_triton
def test_is_available_really_runs_each_op(monkeypatch):
    for op in (None, *kernels.OPS):
        assert kernels.is_available(op), op
    with pytest.raises(ValueError, match="unknown op"):
        kernels.is_available("conv")
    # a kernel that fails (here: a broken launch) makes the op unavailable, without raising
    monkeypatch.setattr(kernels, "_probe_cache", {})
    monkeypatch.setattr(neumann_triton, "neumann_update", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    assert not kernels.is_available("neumann_update")
    assert kernels.is_available("layerwise_sgd_step")


def test_is_available_is_false_without_cuda_or_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kernels.is_available()


@pytest.mark.gpu
@requires_cuda
@requires_triton
def test_auto_picks_triton_for_cuda_tensors(spy):
    kernels.set_backend("auto")
    assert kernels.resolve("mixed_batch_norm", "cuda") == "triton"
    _call_all_ops("cuda")
    assert spy == ["mixed_batch_norm", "neumann_update", "layerwise_sgd_step"]
