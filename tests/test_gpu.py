"""What only a CUDA device can check: compiled Triton kernels, whole runs on the GPU, ``device=auto``.

Every test is marked ``gpu`` (deselected by default: ``pytest -m gpu`` runs them) and skips with
a reason where CUDA is absent. The kernel cases are the parametrizations of tests/kernels/
(imported from there, not copied), widened to fp32 / fp16 / bf16 for every op.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")]

# tests/kernels has no __init__.py: pytest imports its modules by base name with that folder on
# sys.path; do the same, so these are the very modules (and parametrizations) pytest collects.
sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))
import kernel_helpers  # noqa: E402
import test_kernels_mixed_bn as mbn  # noqa: E402
import test_kernels_neumann as neu  # noqa: E402
import test_kernels_sgd as sgd  # noqa: E402

from benchmarks.vectorized import ROUNDING_FACTOR, nudged  # noqa: E402
from pflkit import kernels  # noqa: E402
from pflkit.algorithms import ALGORITHMS  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


@pytest.fixture
def triton_cuda():
    """The shared helpers must really put tensors on CUDA, and Triton must compile (no interpreter)."""
    assert kernel_helpers.DEVICE.type == "cuda"
    if not kernels.triton_importable():
        pytest.skip("Triton is not installed")
    from pflkit.kernels._triton_common import interpreter_enabled

    assert not interpreter_enabled(), "TRITON_INTERPRET=1 on a CUDA machine: the kernels would not be compiled"
    previous = kernels.get_backend()
    yield
    kernels.set_backend(previous)


# ------------------------------------------------------------------ (a) kernels against references


def test_dispatcher_picks_triton_for_cuda_tensors(triton_cuda):
    """``auto`` runs the Triton op on CUDA tensors, and every op passes its self-check there."""
    with kernels.use_backend("auto"):
        assert {op: kernels.resolve(op, "cuda") for op in kernels.OPS} == {op: "triton" for op in kernels.OPS}
    assert kernels.is_available()


@pytest.mark.parametrize("path", mbn.PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode_name", list(mbn.MODES))
@pytest.mark.parametrize("shape_name", list(mbn.SHAPES))
def test_mixed_bn_forward_and_gradients(shape_name, mode_name, dtype, path, tol, triton_cuda, monkeypatch):
    """y, dx, dgamma, ddelta, dbeta and the client running statistics, every shape x mode x dtype,
    through the fused and the split kernels."""
    mbn.force_path(monkeypatch, path)
    mbn._compare(mbn.SHAPES[shape_name], mbn.MODES[mode_name], dtype, "contiguous", tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["channels_last", "permuted"])
@pytest.mark.parametrize("mode_name", list(mbn.MODES))
def test_mixed_bn_memory_layouts(layout, mode_name, dtype, tol, triton_cuda):
    mbn._compare((3, 5, 4, 6), mbn.MODES[mode_name], dtype, layout, tol)


def test_mixed_bn_second_order_and_special_inputs(tol, triton_cuda):
    """Hessian-vector products through the op, a stride-0 upstream gradient, a large-mean input."""
    mbn.test_triton_double_backward_matches_reference()
    mbn.test_triton_backward_of_a_sum_reads_an_expanded_gradient(tol)
    mbn.test_triton_large_mean_is_stable()
    mbn.test_triton_gradients_of_fp16_weight_and_beta_dtypes(tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_neumann_update(dtype, tol, triton_cuda):
    """Both outputs of every tensor of neu.SHAPES (empty, odd, one past a block, 4-D)."""
    neu.test_triton_matches_reference(dtype, tol)


def test_neumann_update_mixed_dtypes_strides_and_series(tol, triton_cuda):
    neu.test_triton_mixed_dtypes_strided_and_misaligned_inputs(tol)
    neu.test_triton_outputs_feed_the_next_iteration_aligned()
    neu.test_q_steps_give_the_truncated_neumann_series("triton")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layerwise_sgd_step_forward_gradients_and_hvp(dtype, tol, triton_cuda):
    """Outputs, d/d(theta, eta) through g(theta) and a Hessian-vector product, every tensor of sgd.SHAPES."""
    sgd.test_triton_forward_and_gradients_match_reference(dtype, tol)


def test_layerwise_sgd_step_clamp_rule(triton_cuda):
    sgd.test_clamp_forward_straight_through_backward("triton")
    sgd.test_no_clamp_lets_negative_rates_through("triton")
    sgd.test_outputs_are_separate_tensors_that_allow_in_place_updates("triton")


# ---------------------------------------------------- (b) whole runs: Triton kernels = reference ops

# Tolerances of a run with kernels=triton against the same run with kernels=reference, both on
# CUDA under `fp32_cuda` (deterministic cuDNN, no TF32: only the kernels differ). The kernels compute
# the same math in another summation order (fp32 partial sums merged by Chan's formula; one multi-tensor
# launch), i.e. ~1e-6 relative per op; a smoke run takes a few dozen SGD and meta steps, after which
# losses agree to ~1e-4 relative. A test prediction whose two best logits are closer than that can
# flip, so a client's accuracy may differ by one test sample, no more. Runs of pFedHN, FedSelect and
# pFedVEM use no custom op (no BN mixing or hypergradient): they must agree to float rounding.
LOSS_RTOL = 1e-3
SAMPLES_THAT_MAY_FLIP = 1


@contextlib.contextmanager
def fp32_cuda():
    """Deterministic cuDNN algorithms and no TF32, so that two runs of the same float32 operations
    (grouped differently) differ by float32 rounding, not by TF32's 10-bit mantissa: torch lets cuDNN
    convolve in TF32 by default on Ampere and later GPUs, and a batched convolution may take another
    algorithm than a single one."""
    flags = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) = flags


def _stage_records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "seed0").glob("*.json")
            if not p.name.endswith(".report.json")}


def _run(name, backend, tmp_path, request, monkeypatch):
    from tests.test_device import CASES, run_recorded

    data_root = None if name == "demo" else request.getfixturevalue("shared_data")
    results, recorder = run_recorded(name, "cuda", tmp_path / backend, data_root, CASES[name],
                                     extra=[f"kernels={backend}"], monkeypatch=monkeypatch)
    monkeypatch.undo()
    assert results["status"] == "ok", {k: m["status"] for k, m in results["methods"].items()}
    assert results["environment"]["device"].startswith("cuda"), results["environment"]
    assert not recorder.calls, f"tensors made without a device in a CUDA run:\n{recorder.report()}"
    return _stage_records(tmp_path / backend / name)


@pytest.mark.parametrize("name", ["fedl2p_table5_digits_c3", "fedl2p_table8_digits_c3", "pfedhn_table1_c10_n10",
                                  "fedselect_table1_s2", "pfedvem_cifar10_n50"])
def test_smoke_run_with_triton_kernels_equals_reference(name, tmp_path, request, monkeypatch, triton_cuda):
    with fp32_cuda():
        ref = _run(name, "reference", tmp_path, request, monkeypatch)
        tri = _run(name, "triton", tmp_path, request, monkeypatch)
    assert ref.keys() == tri.keys() and ref
    for stage, want in ref.items():
        got = tri[stage]
        assert len(got["per_client"]) == len(want["per_client"]) > 0, stage
        for i, (g, w) in enumerate(zip(got["per_client"], want["per_client"])):
            where = f"{name} / {stage} / client {i}"
            assert g["n"] == w["n"], where
            flipped = abs(round(g["acc"] * g["n"]) - round(w["acc"] * w["n"]))
            assert flipped <= SAMPLES_THAT_MAY_FLIP, (where, g, w)
            assert g["loss"] == pytest.approx(w["loss"], rel=LOSS_RTOL, abs=1e-6), where
        for g, w in zip(got["history"], want["history"]):
            if w.get("train_loss") is not None:
                assert g["train_loss"] == pytest.approx(w["train_loss"], rel=LOSS_RTOL), (stage, w["round"])


# --------------------------------------------------------------------------- (c) device = "auto"


def test_auto_device_resolves_to_cuda_and_the_run_uses_it(tmp_path):
    """``device=auto`` gives the run's Env a CUDA device, and the run's models train there."""
    from pflkit.fl.federate import federation_for
    from pflkit.run import runner
    from pflkit.run.environment import initial_model, make_env
    from pflkit.run.experiments import resolve

    cfg = resolve("demo", "smoke", ["device=auto", "pretrain.rounds=1", "methods.*.rounds=1"])
    assert cfg.device == "auto"
    dataset = runner.load_dataset(cfg.data.dataset, None, **cfg.data.options)
    fed = federation_for(cfg.data, dataset, cfg.seed)
    env = make_env(cfg, fed, cfg.seed)
    assert env.device.type == "cuda"
    model = initial_model(env)
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    results = runner.run_experiment(cfg, tmp_path / "auto", progress=False)
    assert results["status"] == "ok"
    assert results["environment"]["device"].startswith("cuda"), results["environment"]


# ------------------------------------------------------------- (d) the vectorized engine on CUDA

# How far two runs may drift apart from float rounding alone is measured, not assumed: the
# sequential run again, from the same start with every weight one ulp up (`nudged`, shared with
# benchmarks/vectorized.py, as is ROUNDING_FACTOR). Local SGD amplifies such a difference, FedSelect's
# top-k mask choice far more than FedAvg (this digits run on the CPU: its one-ulp twin moves a client's
# loss by up to 5.2e-4, FedAvg's by 2e-7; on an H200, TF32 off, the vectorized engine moved FedSelect's
# by 1.3e-3 of 1.31), so the engines may differ by up to ROUNDING_FACTOR times that drift (or LOSS_RTOL,
# whichever is larger); a batching error (a wrong batch, a BatchNorm statistic left out) moves the
# numbers by far more.


@pytest.mark.parametrize("name", sorted(n for n, a in ALGORITHMS.items() if a.vectorizable))
def test_vectorized_engine_on_cuda_equals_the_sequential_one(name, monkeypatch):
    """Every vectorizable algorithm on CUDA: each local-SGD call batched (none runs alone), and the
    run's per-client results and training losses those of the sequential engine, within the drift
    that one float rounding of the start causes (above), under `fp32_cuda` (only the engine differs)."""
    import dataclasses

    from pflkit.fl import engines
    from pflkit.fl.federate import build_federation
    from pflkit.fl.loop import run_rounds
    from tests.fl.test_engines import _config
    from tests.helpers_data import digits_dataset, digits_env

    fed = build_federation(digits_dataset(600), "pathological", 4, seed=0, classes_per_client=3)
    algo, cfg = ALGORITHMS[name], _config(name)
    alone = []
    monkeypatch.setattr(engines, "_noter", lambda algo: alone.append)
    runs = {}
    with fp32_cuda():
        for run, engine in (("sequential", "sequential"), ("vectorized", "vectorized"), ("one ulp", "sequential")):
            env = dataclasses.replace(digits_env(seed=1), engine=engine, device=torch.device("cuda"))
            env.seed_torch("init")
            model = env.model_fn().to(env.device)
            runs[run] = run_rounds(algo, cfg, fed, nudged(model) if run == "one ulp" else model, env)
    seq, vec, ulp = runs["sequential"], runs["vectorized"], runs["one ulp"]
    assert alone == [] and seq.status == vec.status == ulp.status == "ok", (alone, seq.error, vec.error)
    assert vec.engine == "vectorized"

    def flips(a, b):
        return abs(round(a["acc"] * a["n"]) - round(b["acc"] * b["n"]))

    for cid, w in seq.per_client.items():
        g, u = vec.per_client[cid], ulp.per_client[cid]
        assert flips(g, w) <= max(SAMPLES_THAT_MAY_FLIP, ROUNDING_FACTOR * flips(u, w)), (cid, g, w, u)
        drift = ROUNDING_FACTOR * abs(u["loss"] - w["loss"])
        assert g["loss"] == pytest.approx(w["loss"], rel=LOSS_RTOL, abs=max(1e-6, drift)), (cid, u["loss"])
    for g, w, u in zip(vec.history, seq.history, ulp.history):
        if w.get("train_loss") is not None:
            drift = ROUNDING_FACTOR * abs(u["train_loss"] - w["train_loss"])
            assert g["train_loss"] == pytest.approx(w["train_loss"], rel=LOSS_RTOL, abs=drift), (w["round"], u)


def test_vectorized_memory_budget_chunks_on_cuda(monkeypatch):
    """On CUDA, a `PFLKIT_VECTOR_MEMORY` budget below what the round's 4 clients measure on their first step
    runs them in chunks, with the numbers of the round run all at once (within float rounding): the
    twin of tests/fl/test_vectorized_host.py's CPU case; and the default budget is half the free memory."""
    import dataclasses

    from pflkit.fl import engines
    from pflkit.fl.federate import build_federation
    from pflkit.fl.loop import run_rounds
    from pflkit.fl.batchable import MemoryProbe, memory_budget
    from tests.fl.test_engines import _config
    from tests.fl.test_vectorized import smooth
    from tests.helpers_compare import assert_tree
    from tests.helpers_data import digits_dataset, digits_env

    free = torch.cuda.mem_get_info()[0]
    assert 0.3 * free <= memory_budget(torch.device("cuda")) <= 0.6 * free
    fed = build_federation(digits_dataset(600), "pathological", 4, seed=0, classes_per_client=3)
    algo, cfg = ALGORITHMS["fedavg"], _config("fedavg")
    measured, notes = [], []
    real = MemoryProbe.check
    monkeypatch.setattr(MemoryProbe, "check", lambda self, b, n: measured.append((b, n)) or real(self, b, n))
    monkeypatch.setattr(engines, "_noter", lambda algo: notes.append)

    def run():
        env = dataclasses.replace(digits_env(seed=1), engine="vectorized", device=torch.device("cuda"))
        env = dataclasses.replace(env, model_fn=smooth(env.model_fn))  # no ReLU to flip on rounding
        env.seed_torch("init")
        return run_rounds(algo, cfg, fed, env.model_fn().to(env.device), env)

    with fp32_cuda():
        whole = run()
        assert whole.status == "ok" and measured and not notes
        monkeypatch.setenv("PFLKIT_VECTOR_MEMORY", str(int(max(b // n for b, n in measured) * 2.5)))
        chunked = run()
    assert chunked.status == "ok" and notes and all("chunks of 2" in n for n in notes), notes
    assert_tree(chunked.state, whole.state, "state", tol={"rtol": 1e-4, "atol": 1e-5})


def test_auto_engine_is_vectorized_on_cuda():
    from pflkit.fl.engines import resolve_engine

    assert resolve_engine("auto", device_type="cuda", cpus=16, clients=10, vectorizable=True) == "vectorized"
