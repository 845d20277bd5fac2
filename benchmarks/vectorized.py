"""Client-update engines compared: client updates per second of each, as a ratio to the sequential loop.

The workload is FedAvg on the CIFAR-10 subset (IID over ``--clients`` clients, ``--per-round``
sampled per round, batch 32, ``--local-epochs`` local epochs), with LeNet (the workload of
``benchmarks/engine.py``) or the CIFAR ResNet-18. Every engine trains the same rounds through
`pflkit.fl.loop.run_rounds` (no validation or test pass) in this one process; the engines run
interleaved, ``--repeat`` times, and the medians are printed:

* ``sequential``: one client after the other, torch's default intra-op threads (all cores);
* ``threads`` (CPU only): the round's clients in a pool of worker threads, one intra-op thread
  each (`pflkit.fl.engines.run_threads`);
* ``vectorized``: the round's clients trained together, one ``torch.func.vmap`` over their
  stacked weights per step (`pflkit.fl.vectorized`). Meant for a GPU; on a CPU it is printed too.

A column is the median over repeats of (clients per round / median seconds of a warm round,
rounds 2..R); the ratio is that over the sequential column. Peak memory: on CUDA the peak of
``torch.cuda.max_memory_allocated`` during the run; on the CPU the peak growth of the process's
resident memory (sampled every 5 ms). The script checks that the engines end with the same
server state as the sequential loop (threads: bitwise when the sequential loop runs one
intra-op thread, as each worker does; vectorized: within 10x the drift of a sequential run from a
start one ulp off, i.e. float rounding as training amplifies it) and prints the load
average, since the machines these numbers come from are shared.

    PYTHONPATH=. python benchmarks/vectorized.py --repeat 5                      # LeNet, 10 per round
    PYTHONPATH=. python benchmarks/vectorized.py --models lenet,resnet18 --per-round 10,50,100   # the GPU grid
    PYTHONPATH=. python benchmarks/vectorized.py --rounds 3 --repeat 1 --engines threads   # a quick look
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import threading
import time

ENGINES = ("sequential", "threads", "vectorized")
MODELS = {"lenet": "lenet", "resnet18": "resnet18_cifar"}
ROUNDING_FACTOR = 10  # how far past the rounding drift (`compare`) the vectorized state may end


def workload(a, model: str, per_round: int) -> dict:
    """The experiment (as ``benchmarks/engine.py`` builds it) for one model and clients per round."""
    clients = max(a.clients, per_round)
    return {"experiment": {"name": "bench_vectorized"},
            "data": {"dataset": a.dataset, "scheme": "iid", "num_clients": clients},
            "model": {"name": MODELS[model]},
            "methods": {"FedAvg": {"algorithm": "fedavg", "rounds": a.rounds, "fraction": per_round / clients,
                                   "local_epochs": a.local_epochs, "lr": 0.01, "batch_size": 32, "eval_every": 0,
                                   "keep_best": False}}}


def prepare(a, model: str, per_round: int):
    """(algorithm, its config, federation, env) of the workload, built once for every engine."""
    from pflkit.algorithms import get_algorithm
    from pflkit.data.datasets import load_dataset
    from pflkit.experiments import resolve
    from pflkit.runner import build_seed_federation, make_env

    cfg = resolve(workload(a, model, per_round), "cpu", [f"device={a.device}"] if a.device != "auto" else [])
    fed = build_seed_federation(cfg, load_dataset(a.dataset, a.data_root or None), cfg.seed)
    stage = cfg.methods[0]
    return get_algorithm(stage.algorithm), stage.config, fed, make_env(cfg, fed, cfg.seed)


class PeakMemory:
    """Peak memory of a block: CUDA's allocator peak, or the growth of resident memory on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return self
        self.base, self.done = self._rss(), threading.Event()

        def sample():
            while not self.done.wait(0.005):
                self.peak = max(self.peak, self._rss() - self.base)
        self.sampler = threading.Thread(target=sample, daemon=True)
        self.sampler.start()
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.done.set()
            self.sampler.join()
        return False


def nudged(model):
    """``model`` with every floating-point parameter one ulp up: one float rounding of the start."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    return model


def run_engine(name: str, algo, cfg, fed, env, nudge: bool = False) -> tuple[float, dict, int]:
    """(client updates per second over the warm rounds, final server state, peak bytes) of one engine;
    ``nudge``: from the start moved one ulp (`nudged`)."""
    import torch

    from pflkit.fl.loop import run_rounds

    run_env = dataclasses.replace(env, engine=name, _scratch={})
    run_env.seed_torch("init")
    model = nudged(run_env.model_fn()) if nudge else run_env.model_fn()
    with PeakMemory(torch.device(env.device)) as mem:
        result = run_rounds(algo, cfg, fed, model, run_env, test=False)
    assert result.status == "ok" and result.engine == name, (result.status, result.engine, result.error)
    warm = [row["seconds"] for row in result.history[1:]] or [result.history[0]["seconds"]]
    return cfg.fraction * fed.num_clients / statistics.median(warm), result.state, mem.peak


def max_difference(a: dict, b: dict) -> float:
    """Largest absolute difference between two FedAvg server states (0.0: bitwise equal)."""
    return max(float((a["weights"][k].double() - b["weights"][k].double()).abs().max()) for k in a["weights"])


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def compare(a, model: str, per_round: int, engines: list[str]) -> bool:
    """Time every engine on one workload, print its table; True when the final states agree."""
    import torch

    from pflkit.fl.engines import intra_op_threads

    algo, cfg, fed, env = prepare(a, model, per_round)
    print(f"\n{model}, {per_round} of {fed.num_clients} clients per round ({fed.clients[0].num('train')} train "
          f"images on client 0), {a.local_epochs} local epoch(s), {a.rounds} rounds, device {env.device}")
    rates: dict[str, list[float]] = {e: [] for e in engines}
    peaks: dict[str, list[int]] = {e: [] for e in engines}
    states: dict[str, dict] = {}
    for r in range(a.repeat):
        for e in engines:
            rate, states[e], peak = run_engine(e, algo, cfg, fed, env)
            rates[e].append(rate)
            peaks[e].append(peak)
            print(f"  repeat {r + 1} {e:>10}: {rate:8.2f} client updates/s, peak {peak / 2**20:7.1f} MiB")
    base = statistics.median(rates[engines[0]])
    print(f"{'engine':>12} {'updates/s':>10} {'ratio':>7} {'peak MiB':>9}  (medians of {a.repeat}; ratio to "
          f"{engines[0]})")
    for e in engines:
        med = statistics.median(rates[e])
        print(f"{e:>12} {med:10.2f} {med / base:6.2f}x {max(peaks[e]) / 2**20:9.1f}")
    # the same numbers: the threads engine runs one intra-op thread per worker, so the sequential loop
    # at one thread gives its state bitwise; the vectorized engine batches the same float operations
    # differently, so its state agrees up to float rounding as local SGD amplifies it: at most
    # ROUNDING_FACTOR times the drift of a sequential run whose start is one ulp off (deep BatchNorm
    # nets amplify a lot: ResNet-18's one-ulp twin ends ~1e-3 away after five steps)
    with intra_op_threads(1):
        _, one_thread, _ = run_engine("sequential", algo, cfg, fed, env)
        _, one_ulp, _ = run_engine("sequential", algo, cfg, fed, env, nudge=True)
    drift = max_difference(one_ulp, one_thread)
    print(f"rounding drift: a sequential run from a start one ulp off ends {drift:.2g} away (1 intra-op thread)")
    ok = True
    for e in engines[1:]:
        diff, single = max_difference(states[e], states["sequential"]), max_difference(states[e], one_thread)
        print(f"final server state, {e} vs sequential: max |difference| {diff:.2g} at {torch.get_num_threads()} "
              f"intra-op threads, {single:.2g} at 1 intra-op thread")
        ok &= single == 0.0 if e == "threads" else single <= max(1e-4, ROUNDING_FACTOR * drift)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-root", default=os.environ.get("PFLKIT_DATA"), help="folder with cifar10_small.npz")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--models", default=None, help="lenet, resnet18 (default: lenet; on CUDA both)")
    ap.add_argument("--per-round", default=None, help="clients per round, comma-separated (default: 10; on CUDA "
                                                     "10,50,100)")
    ap.add_argument("--clients", type=int, default=100, help="clients in the federation (at least --per-round)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run (the first is a warm-up)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, interleaved; medians are reported")
    ap.add_argument("--engines", default=None, help="compared with sequential (always run; default: threads and "
                                                   "vectorized on a CPU, vectorized on CUDA)")
    ap.add_argument("--tf32", choices=("default", "off"), default="default",
                    help="off: full-fp32 convolutions and matmuls on CUDA (torch's default lets cuDNN convolve in "
                         "TF32, a 10-bit mantissa)")
    a = ap.parse_args(argv)
    import torch

    if a.tf32 == "off":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    cuda = a.device.startswith("cuda") or (a.device == "auto" and torch.cuda.is_available())
    models = (a.models or ("lenet,resnet18" if cuda else "lenet")).split(",")
    per_round = [int(n) for n in (a.per_round or ("10,50,100" if cuda else "10")).split(",")]
    engines = ["sequential"] + [e for e in (a.engines or ("vectorized" if cuda else "threads,vectorized")).split(",")
                                if e != "sequential"]
    for bad, known, flag in ((set(engines) - set(ENGINES), ENGINES, "--engines"),
                             (set(models) - set(MODELS), tuple(MODELS), "--models")):
        if bad:
            ap.error(f"{flag}: unknown {sorted(bad)[0]!r}; known: {', '.join(known)}")
    if cuda and "threads" in engines:
        ap.error("--engines: the threads engine runs on the CPU only")
    gpu = torch.cuda.get_device_name() if cuda else "none"
    tf32 = f", TF32 convolutions {torch.backends.cudnn.allow_tf32}, matmuls {torch.backends.cuda.matmul.allow_tf32}"
    print(f"{os.cpu_count()} CPUs, GPU: {gpu}{tf32 if cuda else ''}, torch {torch.__version__} with "
          f"{torch.get_num_threads()} intra-op threads; load average before: {load_average()}")
    t0 = time.perf_counter()
    ok = all([compare(a, m, n, engines) for m in models for n in per_round])
    print(f"\nload average after: {load_average()} ({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
