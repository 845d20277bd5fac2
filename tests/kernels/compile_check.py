"""Compile every Triton kernel variant pflkit launches, for real GPU targets, without a GPU.

Run as a script (``python tests/kernels/compile_check.py 75 80 90 [--dtypes bf16,fp32]``): the ops are first
*dry-run* on GPU-sized CPU tensors with every launch recorded instead of executed (the
recorded kernel, argument types, constexprs and num_warps are exactly what a CUDA run would
compile), then each distinct variant goes through Triton's full pipeline to a cubin for
each compute capability (ptxas ships with Triton). Catches what the CPU interpreter cannot:
type errors of the compiled language, unsupported ops, register-file blow-ups.

Must run in a fresh process: an interpreted launch earlier in the same process leaves
Triton's language module patched for the interpreter.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pflkit.kernels import _triton_common, mixed_bn_triton, neumann_triton, sgd_triton  # noqa: E402

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
         torch.int64: "i64"}


def record_variants(dtypes=(torch.float32, torch.float16, torch.bfloat16)) -> dict[str, dict]:
    """Dry-run the ops on GPU-sized shapes; return {key: variant} of the launches."""
    variants: dict[str, dict] = {}

    def fake_getitem(self, grid):
        def launch(*args, **kwargs):
            params = inspect.signature(self.fn).parameters
            values = dict(zip(params, args))
            values.update(kwargs)
            num_warps = values.pop("num_warps", 4)
            sig, const, aligned = {}, {}, []
            for i, (name, param) in enumerate(params.items()):
                v = values[name]
                if "constexpr" in str(param.annotation) or v is None:
                    sig[name], const[name] = "constexpr", v
                elif isinstance(v, torch.Tensor):
                    sig[name] = "*" + TYPES[v.dtype]
                    if v.data_ptr() % 16 == 0:
                        aligned.append(i)
                elif isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"{self.fn.__name__}: argument {name}={v!r}")
                elif isinstance(v, int):
                    sig[name] = "i64" if abs(v) >= 2**31 else "i32"
                    if v % 16 == 0:
                        aligned.append(i)
                else:
                    sig[name] = "fp32"
            # Triton's launcher marks 16-divisible integers and 16-byte aligned pointers
            # ("tt.divisibility"); the same attributes are passed here.
            key = json.dumps([self.fn.__name__, sig, const, num_warps, aligned], sort_keys=True)
            variants[key] = dict(module=self.fn.__module__, kernel=self.fn.__name__, signature=sig,
                                 constexprs=const, num_warps=num_warps, aligned=aligned)
        return launch

    original = _triton_common.LazyKernel.__getitem__
    _triton_common.LazyKernel.__getitem__ = fake_getitem
    try:
        _dry_run_ops(dtypes)
    finally:
        _triton_common.LazyKernel.__getitem__ = original
    return variants


def _dry_run_ops(dtypes) -> None:
    shapes = [((8, 64, 56, 56), False), ((8, 64, 56, 56), True), ((8, 512, 7, 7), False), ((32, 100), False)]
    for dtype in dtypes:
        for shape, channels_last in shapes:
            C = shape[1]
            for training, mode, beta in ((True, "mixed", torch.rand(C)), (False, "mixed", 0.5), (True, "batch", 0.0)):
                x = torch.empty(shape, dtype=dtype)
                if channels_last:
                    x = x.to(memory_format=torch.channels_last)
                x.requires_grad_()
                w = torch.ones(C, requires_grad=True)
                b = beta.clone().requires_grad_() if isinstance(beta, torch.Tensor) else beta
                y = mixed_bn_triton.mixed_batch_norm(x, torch.zeros(C), torch.ones(C), torch.zeros(C),
                                                     torch.ones(C), b, w, torch.zeros(C), training, 0.1, 1e-5, mode)
                y.backward(torch.empty_like(y), retain_graph=True)
            y.sum().backward()  # a stride-0 gradient: the general-stride layout
        vs = [torch.empty(s, dtype=dtype) for s in ((64, 3, 7, 7), (64,), (1000, 512))]
        neumann_triton.neumann_update(vs, vs, vs, 0.1)
        params = [t.clone().requires_grad_() for t in vs]
        eta = torch.ones(len(vs), requires_grad=True)
        out = sgd_triton.layerwise_sgd_step(params, vs, eta, 1.0)
        torch.autograd.grad(sum(o.sum() for o in out), params + [eta])


def compile_all(variants: list[dict], arch: int) -> list[str]:
    failures = []
    for v in variants:
        module = sys.modules[v["module"]]
        fn = getattr(module, v["kernel"]).jitted()  # compiled mode: TRITON_INTERPRET=0 above
        try:
            attrs = {(i,): [["tt.divisibility", 16]] for i in v["aligned"]}
            triton.compile(ASTSource(fn, v["signature"], constexprs=v["constexprs"], attrs=attrs),
                           target=GPUTarget("cuda", arch, 32), options={"num_warps": v["num_warps"]})
        except Exception as exc:  # report every failing variant, not only the first
            failures.append(f"sm_{arch} {v['kernel']} {v['constexprs']}: {str(exc)[-800:]}")
    return failures


def main(archs: list[int], dtypes) -> int:
    start = time.time()
    variants = list(record_variants(dtypes).values())
    failures = [f for arch in archs for f in compile_all(variants, arch)]
    for f in failures:
        print("FAIL", f)
    print(f"compiled {len(variants)} variants x {len(archs)} targets, {len(failures)} failures, "
          f"{time.time() - start:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    names = "fp32,fp16,bf16"
    if "--dtypes" in args:
        i = args.index("--dtypes")
        names = args[i + 1]
        del args[i:i + 2]
    by_name = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    sys.exit(main([int(a) for a in args] or [80], [by_name[n] for n in names.split(",")]))
