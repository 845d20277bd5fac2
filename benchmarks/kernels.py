"""Benchmark pflkit's Triton kernels against their PyTorch eager composites.

    python benchmarks/kernels.py                 # GPU if present, else the CPU reference only
    python benchmarks/kernels.py --repeats 50 --json kernels.json

On a CUDA device each op is timed two ways, for the Triton kernel and for the eager composite
(the pure-PyTorch reference):

* wall: CUDA events around one call, median of ``--repeats`` after warm-up. At these sizes a
  call is host-bound (Python, autograd and kernel launches take longer than the kernels run),
  so this is what a loop that waits on every call sees;
* device: the kernels' own time, summed from torch.profiler's device events over ``--repeats``
  calls. This is what the kernel costs when the host runs ahead of the GPU, and the only
  figure a bandwidth fraction makes sense for.

It prints both speed-ups over eager, the device time's fraction of the device's measured copy
bandwidth, and the targets of issue 4, judged on device time:

* mixed BN forward + backward: >= 1.5x the eager composite and >= 70% of copy bandwidth;
* multi-tensor Neumann update over ResNet-18's parameter list: >= 5x the per-tensor loop.

"Useful bytes" count the minimum traffic of each op: mixed BN training forward reads x
twice and writes y, its backward reads x and dy twice and writes dx (8 |x| in all); the
Neumann step reads v, Hv, p and writes v', p' (5 |params|); the SGD step reads theta, g
and writes theta' (3 |params|). torch's own BatchNorm2d (cuDNN, no mixing) and
``torch._foreach`` ops are timed beside them for scale, and where mixed BN takes its fused
one-launch kernels (small channels-first inputs) its split kernels are timed too. Without a
GPU the references are timed on the CPU (wall clock, median) and the GPU figures are
reported as not measured.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from pflkit import kernels

TARGETS = {"mixed_bn_speedup": 1.5, "mixed_bn_copy_fraction": 0.70, "neumann_speedup": 5.0}


def resnet18_shapes() -> list[tuple[int, ...]]:
    """Shapes of torchvision ResNet-18's parameters (62 tensors, 11.7M values)."""
    try:
        import torchvision

        return [tuple(p.shape) for p in torchvision.models.resnet18().parameters()]
    except Exception:  # torchvision missing: the same list, written out
        shapes = [(64, 3, 7, 7), (64,), (64,)]
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for block in range(2):
                c_in = cin if block == 0 else cout
                shapes += [(cout, c_in, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
                if block == 0 and (stride != 1 or cin != cout):
                    shapes += [(cout, cin, 1, 1), (cout,), (cout,)]
            cin = cout
        return shapes + [(1000, 512), (1000,)]


def timer(device: torch.device, repeats: int, warmup: int = 3):
    """A function timing ``fn()``: median milliseconds (CUDA events on a GPU, wall clock else)."""
    def measure(fn) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return measure


def device_timer(repeats: int, warmup: int = 3):
    """A function giving the mean device milliseconds of ``fn()``'s kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    def measure(fn) -> float:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
        # Every kernel and copy appears once as a device event: the self times add up to the total.
        return sum(e.self_device_time_total for e in prof.key_averages()) / repeats / 1e3
    return measure


def copy_bandwidth(device: torch.device, measure, mbytes: int = 512) -> float:
    """GB/s of a device-to-device copy (read + write counted), the practical ceiling."""
    src = torch.empty(mbytes * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = measure(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def timed(measure, fn, nbytes: int) -> dict:
    """``measure`` is one timer or a dict of them (name -> timer); bytes ride along."""
    if isinstance(measure, dict):
        return {**{name: m(fn) for name, m in measure.items()}, "bytes": nbytes}
    return {"ms": measure(fn), "bytes": nbytes}


def bench_mixed_bn(device, measure, shape, dtype, channels_last, backend) -> dict:
    g = torch.Generator().manual_seed(0)
    C = shape[1]
    x = torch.randn(shape, generator=g).to(device, dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    dy = torch.randn(shape, generator=g).to(device, dtype)
    if channels_last:
        dy = dy.to(memory_format=torch.channels_last)
    w, b = torch.ones(C, device=device, requires_grad=True), torch.zeros(C, device=device, requires_grad=True)
    beta = torch.full((C,), 0.5, device=device, requires_grad=True)
    stats = [torch.zeros(C, device=device), torch.ones(C, device=device), torch.zeros(C, device=device),
             torch.ones(C, device=device)]

    def step():
        with kernels.use_backend(backend):
            y = kernels.mixed_batch_norm(x, *stats, beta, w, b, True)
            torch.autograd.grad(y, (x, w, b, beta), dy)

    def cudnn_step():
        y = torch.nn.functional.batch_norm(x, stats[2], stats[3], w, b, True, 0.1, 1e-5)
        torch.autograd.grad(y, (x, w, b), dy)

    return timed(measure, cudnn_step if backend == "torch" else step, 8 * x.numel() * x.element_size())


def uses_fused_kernels(shape, channels_last: bool) -> bool:
    """Whether mixed BN takes its one-launch path for this input (see mixed_bn_triton._Tiling)."""
    from pflkit.kernels import mixed_bn_triton

    x = torch.empty(shape, device="meta")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    strides = mixed_bn_triton._ncs_strides(x)
    return mixed_bn_triton._Tiling(shape[0], shape[1], math.prod(shape[2:]), strides, torch.device("meta")).fused


def bench_split_path(device, measure, shape, dtype, channels_last) -> dict:
    """The Triton mixed BN forced onto its split (three launches each way) kernels."""
    from pflkit.kernels import mixed_bn_triton

    saved = mixed_bn_triton.FUSED_MAX_M
    mixed_bn_triton.FUSED_MAX_M = 0
    try:
        return bench_mixed_bn(device, measure, shape, dtype, channels_last, "triton")
    finally:
        mixed_bn_triton.FUSED_MAX_M = saved


def bench_list_op(device, measure, shapes, op: str, backend: str) -> dict:
    g = torch.Generator().manual_seed(0)
    tensors = [[torch.randn(s, generator=g).to(device) for s in shapes] for _ in range(3)]
    numel = sum(t.numel() for t in tensors[0])
    if op == "neumann_update":
        v, hv, p = tensors

        def step():
            with kernels.use_backend(backend), torch.no_grad():
                kernels.neumann_update(v, hv, p, 0.1)
        return timed(measure, step, 5 * numel * 4)
    params, grads = tensors[0], tensors[1]
    eta = torch.rand(len(shapes), device=device)

    def step():
        with kernels.use_backend(backend), torch.no_grad():
            kernels.layerwise_sgd_step(params, grads, eta, max_lr=1.0)
    return timed(measure, step, 3 * numel * 4)


def foreach_neumann(device, measure, shapes) -> dict:
    """torch._foreach_* (PyTorch's own multi-tensor kernels), for reference."""
    g = torch.Generator().manual_seed(0)
    v, hv, p = ([torch.randn(s, generator=g).to(device) for s in shapes] for _ in range(3))

    def step():
        v_new = torch._foreach_add(v, hv, alpha=-0.1)
        torch._foreach_add(p, v_new)
    return timed(measure, step, 5 * sum(t.numel() for t in v) * 4)


def run_gpu(device, repeats) -> dict:
    wall = timer(device, repeats)
    measure = {"wall": wall, "device": device_timer(repeats)}
    ceiling = copy_bandwidth(device, wall)
    print(f"device: {torch.cuda.get_device_name(device)}; measured copy bandwidth {ceiling:.0f} GB/s")

    def bw(r: dict) -> float:
        return r["bytes"] / (r["device"] * 1e-3) / 1e9 / ceiling

    rows, ok = [], True
    for shape, dtype, cl in (((32, 64, 56, 56), torch.float32, False), ((32, 64, 56, 56), torch.float32, True),
                             ((32, 64, 56, 56), torch.bfloat16, False), ((32, 64, 56, 56), torch.bfloat16, True),
                             ((32, 256, 14, 14), torch.float32, False), ((32, 512, 7, 7), torch.float32, False)):
        tri = bench_mixed_bn(device, measure, shape, dtype, cl, "triton")
        eager = bench_mixed_bn(device, measure, shape, dtype, cl, "reference")
        passed = (eager["device"] / tri["device"] >= TARGETS["mixed_bn_speedup"]
                  and bw(tri) >= TARGETS["mixed_bn_copy_fraction"])
        ok &= passed
        name = f"mixed_bn fwd+bwd {shape} {str(dtype)[6:]} {'NHWC' if cl else 'NCHW'}"
        rows.append((name, tri, eager, "PASS" if passed else "MISS"))
        if dtype == torch.float32:
            rows.append(("  (torch BatchNorm2d, cuDNN, no mixing)",
                         bench_mixed_bn(device, measure, shape, dtype, cl, "torch"), None, ""))
        if uses_fused_kernels(shape, cl):
            rows.append(("  (the same, split kernels: 3 launches each way)",
                         bench_split_path(device, measure, shape, dtype, cl), eager, ""))
    shapes = resnet18_shapes()
    for op, target in (("neumann_update", TARGETS["neumann_speedup"]), ("layerwise_sgd_step", None)):
        tri = bench_list_op(device, measure, shapes, op, "triton")
        loop = bench_list_op(device, measure, shapes, op, "reference")
        verdict = "" if target is None else ("PASS" if loop["device"] / tri["device"] >= target else "MISS")
        ok &= verdict != "MISS"
        rows.append((f"{op} ResNet-18 list ({len(shapes)} tensors)", tri, loop, verdict))
    rows.append(("  (torch._foreach Neumann, for comparison)", foreach_neumann(device, measure, shapes), None, ""))
    print(f"{'op':52s} {'wall ms':>15s} {'wall':>6s} {'device ms':>15s} {'device':>7s} {'device BW':>9s}")
    print(f"{'':52s} {'triton / eager':>15s} {'x':>6s} {'triton / eager':>15s} {'x':>7s} {'of copy':>9s}")
    table = []
    for name, tri, eager, verdict in rows:
        e_wall, e_dev = (eager["wall"], eager["device"]) if eager else (float("nan"), float("nan"))
        print(f"{name:52s} {tri['wall']:7.3f} {e_wall:7.3f} {e_wall / tri['wall']:5.2f}x {tri['device']:7.3f} "
              f"{e_dev:7.3f} {e_dev / tri['device']:6.2f}x {100 * bw(tri):8.0f}% {verdict}")
        table.append({"op": name, "wall_ms": tri["wall"], "eager_wall_ms": e_wall, "device_ms": tri["device"],
                      "eager_device_ms": e_dev, "device_copy_fraction": bw(tri), "verdict": verdict})
    print("targets (on device time):", TARGETS, "->", "all met" if ok else "some missed")
    return {"device": torch.cuda.get_device_name(device), "copy_GBps": ceiling, "rows": table, "targets_met": ok}


def run_cpu(repeats) -> dict:
    device = torch.device("cpu")
    measure = timer(device, repeats, warmup=1)
    rows = []
    x = bench_mixed_bn(device, measure, (8, 64, 28, 28), torch.float32, False, "reference")
    rows.append(("mixed_bn fwd+bwd (8, 64, 28, 28) fp32, reference", x["ms"], x["bytes"] / (x["ms"] * 1e-3) / 1e9))
    shapes = resnet18_shapes()
    for op in ("neumann_update", "layerwise_sgd_step"):
        r = bench_list_op(device, measure, shapes, op, "reference")
        rows.append((f"{op} ResNet-18 list, per-tensor reference", r["ms"], r["bytes"] / (r["ms"] * 1e-3) / 1e9))
    print(f"{'op (CPU, PyTorch reference)':58s} {'ms':>9s} {'GB/s':>7s}")
    for name, ms, gbps in rows:
        print(f"{name:58s} {ms:9.2f} {gbps:7.1f}")
    print("No CUDA device: the Triton kernels, the copy-bandwidth ceiling and the GPU targets were NOT measured.")
    return {"device": "cpu", "rows": rows, "gpu_measured": False}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions (median reported)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    use_cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.device == "cuda" and not use_cuda:
        parser.error("--device cuda: no CUDA device is available")
    if use_cuda and not kernels.is_available():
        print("Triton kernels are not available on this device; see the log for why.", file=sys.stderr)
        return 1
    result = run_gpu(torch.device("cuda"), args.repeats) if use_cuda else run_cpu(args.repeats)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
