"""Cost of FedL2P's IFT hypergradient against first-order and Hessian-free MAML meta-gradients (App. C).

All three are computed in one process on the same model and the same batches:

* IFT: `pflkit.meta.hypergrad.ift_hypergrad` exactly as a FedL2P client calls it (Alg. 2, Q = 3
  Neumann steps, psi = 0.1, the losses of `pflkit.meta.objectives.meta_losses`): ``L_T`` of
  Eq. 9-10 through the last fine-tuning step (``--lt-mode last_step``, the default: that step's
  gradient on the first batch, the loss on the second, evaluation mode) or with an extra
  look-ahead step (``--lt-mode lookahead``: a step batch and a loss batch, training mode),
  ``L_V`` on a validation batch, lambda = the BNNet / LRNet weights and eta_tilde, at a
  fine-tuned theta (here: the pretrained weights, the cost does not depend on where); with
  ``--compare-old`` also "IFT (old)", the same hypergradient with autograd's own convolution double
  backward (``cheap_conv=False``);
* FO-MAML: `fo_maml_metagrad` (one inner step on the training batch, the outer gradient
  on the validation batch);
* HF-MAML: `hf_maml_metagrad` (FO-MAML plus a finite-difference Hessian-vector product,
  Per-FedAvg (HF)).

Repetitions alternate between the three so that machine noise hits all alike; the script
prints the median wall time of each, the ratios IFT / FO-MAML and IFT / HF-MAML (the paper,
App. C: 0.24 s vs 0.08 s and 0.16 s, i.e. 3.0x and 1.5x, on a GPU; pflkit's target: at most
3.0x FO-MAML), a breakdown of the IFT time, and the peak memory of each meta-update: on CUDA
``torch.cuda.max_memory_allocated``; on CPU the peak of live tensor storage created during the
call (a dispatch-mode tracker; the model's weights and the batches are excluded on both).

    python benchmarks/hypergradient.py                       # CIFAR ResNet-18, batch 32
    python benchmarks/hypergradient.py --model lenet --repeats 20
    python benchmarks/hypergradient.py --lt-mode lookahead   # pflkit's earlier L_T
    python benchmarks/hypergradient.py --compare-old         # also the IFT before pflkit.meta.conv_hvp
"""
from __future__ import annotations

import argparse
import statistics
import time
import weakref
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pflkit.kernels import differentiated_twice
from pflkit.meta.functional import forward, model_tensors
from pflkit.meta.conv_hvp import cheap_conv_double_backward
from pflkit.meta.hypergrad import fo_maml_metagrad, hf_maml_metagrad, ift_hypergrad
from pflkit.meta.objectives import LT_MODES, meta_losses
from pflkit.meta.linear_solve import neumann
from pflkit.meta.metanets import MetaSpec, init_meta_params, meta_hyperparams
from pflkit.models import build_model
from pflkit.models.introspect import bn_modules, layer_input_modules, layer_param_names
from pflkit.models.mixed_bn import convert_bn, init_client_stats


class StoragePeak(TorchDispatchMode):
    """Peak bytes of tensor storage created inside the context and still alive (CPU or CUDA)."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: set = set()

    def _free(self, key, nbytes):
        self._live.discard(key)
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = (st.data_ptr(), id(st))
                if st.data_ptr() and key not in self._live:
                    self._live.add(key)
                    self.current += st.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(st, self._free, key, st.nbytes())
        return out


def setup(model_name: str, batch_size: int, device: torch.device, seed: int = 0, lt_mode: str = "last_step"):
    """A pretrained-like model with FedL2P's BN layers, the batches, lambda and the three losses."""
    torch.manual_seed(seed)
    options = {"bn": True, "width": 32} if model_name == "lenet" else {}
    model = convert_bn(build_model(model_name, num_classes=10, input_shape=(3, 32, 32), **options)).to(device)
    batches = [(torch.randn(batch_size, 3, 32, 32, device=device), torch.randint(0, 10, (batch_size,), device=device))
               for _ in range(3)]  # step batch (the last fine-tuning batch), loss batch, validation batch
    init_client_stats(model, [batches[0][0]])
    params, buffers = model_tensors(model)
    spec = MetaSpec(num_bn=len(bn_modules(model)), num_layers=len(layer_input_modules(model)),
                    num_tensors=len(layer_param_names(model)), fixed_lr=1e-3)
    with torch.device("meta"):
        nets = spec.modules()
    lam = {k: v.to(device) for k, v in init_meta_params(spec, torch.Generator().manual_seed(seed)).items()}
    xi = torch.rand(spec.num_bn, device=device)
    feats = torch.randn(2 * spec.num_layers, device=device)
    names, keys = list(params), list(lam)

    def hp(lm):
        beta, eta = meta_hyperparams(spec, nets, dict(zip(keys, lm)), xi, feats)
        return beta, eta.to(device)

    with torch.no_grad():
        beta0 = hp([lam[k] for k in keys])[0]

    def ce(th, batch):  # the MAML losses: plain CE at the current BN mixing, training mode
        copies = {n: b.clone() for n, b in buffers.items()}
        return F.cross_entropy(forward(model, dict(zip(names, th)), copies, batch[0], beta=beta0, training=True),
                               batch[1])

    grads = None
    if lt_mode == "last_step":  # the last fine-tuning step's gradient: computed once, outside the timing
        th0 = [p.detach().requires_grad_(True) for p in params.values()]
        grads = [g.detach() for g in torch.autograd.grad(ce(th0, batches[0]), th0)]
    train_loss, val_loss, _ = meta_losses(model, names, hp, buffers, batches[2], lt_mode=lt_mode,
                                          loss_b=batches[1], step_b=batches[0], grads=grads)

    theta, lm = list(params.values()), [lam[k] for k in keys]
    return {
        "IFT": lambda: ift_hypergrad(train_loss, val_loss, theta, lm, solve=partial(neumann, steps=3, psi=0.1)),
        "IFT (old)": lambda: ift_hypergrad(train_loss, val_loss, theta, lm, solve=partial(neumann, steps=3, psi=0.1),
                                           cheap_conv=False),
        "FO-MAML": lambda: fo_maml_metagrad(lambda t: ce(t, batches[0]), lambda t: ce(t, batches[2]), theta,
                                            alpha=1e-3),
        "HF-MAML": lambda: hf_maml_metagrad(lambda t: ce(t, batches[0]), lambda t: ce(t, batches[2]), theta,
                                            alpha=1e-3),
        "IFT parts": (train_loss, val_loss, theta, lm),
    }, sum(p.numel() for p in params.values()), sum(v.numel() for v in lam.values())


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # set by --clock


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = clock()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return clock() - t


def peak_bytes(fn, device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with StoragePeak() as tracker:
        fn()
    return tracker.peak


def ift_breakdown(parts, device, cheap_conv: bool = True) -> dict[str, float]:
    """Seconds of Alg. 2's pieces: d L_V, the graph of d_theta L_T, Q = 3 HVPs, the mixed product.

    ``cheap_conv``: the graph built as `ift_hypergrad` builds it (convolutions of
    `pflkit.meta.conv_hvp`), or with autograd's own convolution double backward (the old IFT).
    """
    from pflkit.meta.hypergrad import leaves

    train_loss, val_loss, theta, lm = parts
    out = {}
    th, la = leaves(theta), leaves(lm)
    t0 = clock()
    g = torch.autograd.grad(val_loss(th, la), th + la, allow_unused=True)
    out["d L_V (theta, lambda)"] = clock() - t0
    t0 = clock()
    with cheap_conv_double_backward(cheap_conv), differentiated_twice():
        lt = train_loss(th, la)
    dt = torch.autograd.grad(lt, th, create_graph=True)
    out["d_theta L_T with graph"] = clock() - t0
    v = [x.detach() if x is not None else torch.zeros_like(t) for x, t in zip(g[:len(th)], th)]
    t0 = clock()
    for _ in range(3):
        pairs = [(d, u) for d, u in zip(dt, v) if d.requires_grad]
        hv = torch.autograd.grad([d for d, _ in pairs], th, [u for _, u in pairs], retain_graph=True, allow_unused=True)
        v = [u - 0.1 * (h if h is not None else 0) for u, h in zip(v, hv)]
    out["3 Hessian-vector products"] = clock() - t0
    t0 = clock()
    pairs = [(d, u) for d, u in zip(dt, v) if d.requires_grad]
    torch.autograd.grad([d for d, _ in pairs], la, [u for _, u in pairs], allow_unused=True)
    out["mixed product (d_lambda d_theta L_T)"] = clock() - t0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18_cifar", help="resnet18_cifar (App. C) or lenet")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lt-mode", default="last_step", choices=LT_MODES,
                    help="FedL2P's L_T: through the last fine-tuning step (default) or an extra look-ahead step")
    ap.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                    help="wall time, or this process's CPU time (with --threads 1: robust to other jobs "
                         "sharing the CPU; CPU runs only)")
    ap.add_argument("--compare-old", action="store_true",
                    help="also time the earlier IFT (autograd's convolution double backward) and its breakdown")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1:
        raise SystemExit("--repeats and --batch-size must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCKS[args.clock]
    device = torch.device(args.device)
    fns, n_theta, n_lam = setup(args.model, args.batch_size, device, lt_mode=args.lt_mode)
    methods = ("IFT", "FO-MAML", "HF-MAML") + (("IFT (old)",) if args.compare_old else ())
    print(f"{args.model}, batch {args.batch_size}, device {device}, {torch.get_num_threads()} threads, "
          f"L_T {args.lt_mode}, {args.clock} clock: "
          f"{n_theta:,} model parameters, {n_lam:,} meta-parameters (lambda)")
    for m in methods:  # warm-up (allocator, kernels)
        fns[m]()
    times = {m: [] for m in methods}
    for _ in range(args.repeats):
        for m in methods:
            times[m].append(timed(fns[m], device))
    med = {m: statistics.median(times[m]) for m in methods}
    mem = {m: peak_bytes(fns[m], device) for m in methods}
    print(f"\n{'meta-gradient':10s} {'median s':>9s} {'min s':>8s} {'peak MiB':>9s}   (over {args.repeats} repeats)")
    for m in methods:
        print(f"{m:10s} {med[m]:9.3f} {min(times[m]):8.3f} {mem[m] / 2**20:9.1f}")
    if args.compare_old:
        print(f"\nIFT (old) / IFT = {med['IFT (old)'] / med['IFT']:.2f}x   "
              f"IFT (old) / FO-MAML = {med['IFT (old)'] / med['FO-MAML']:.2f}x")
    r_fo, r_hf = med["IFT"] / med["FO-MAML"], med["IFT"] / med["HF-MAML"]
    print(f"\ntime ratio   IFT / FO-MAML = {r_fo:.2f}x   IFT / HF-MAML = {r_hf:.2f}x   "
          f"(paper App. C: 3.0x and 1.5x; target: IFT / FO-MAML <= 3.0x -> {'met' if r_fo <= 3.0 else 'NOT met'})")
    print(f"memory ratio IFT / FO-MAML = {mem['IFT'] / mem['FO-MAML']:.2f}x   "
          f"IFT / HF-MAML = {mem['IFT'] / mem['HF-MAML']:.2f}x   (paper: FedL2P's meta-update peaks at 1.3 GB)")
    for label, cheap in (("IFT", True),) + ((("IFT (old)", False),) if args.compare_old else ()):
        parts = ift_breakdown(fns["IFT parts"], device, cheap_conv=cheap)
        print(f"\n{label} breakdown (one call, seconds):")
        for k, v in parts.items():
            print(f"  {k:38s} {v:7.3f}")
        print(second_order_floor(parts, med["FO-MAML"]))
    return 0


def second_order_floor(parts: dict[str, float], fo_maml: float) -> str:
    """The share of IFT / FO-MAML that Alg. 2's second-order passes alone take (one line).

    With Q = 3 the hypergradient needs three Hessian-vector products and the mixed product
    at the solve's output, each a reverse pass over the graph of ``d_theta L_T``; none can
    be shared (the mixed term's learning-rate part is one more product with H). Their time
    over FO-MAML's is a floor for IFT / FO-MAML on the device at hand, before any
    first-order gradient.
    """
    passes = parts["3 Hessian-vector products"] + parts["mixed product (d_lambda d_theta L_T)"]
    return (f"  the 4 second-order passes alone: {passes:.3f} s = {passes / fo_maml:.2f}x FO-MAML "
            f"(a floor for IFT / FO-MAML here)")


if __name__ == "__main__":
    raise SystemExit(main())
