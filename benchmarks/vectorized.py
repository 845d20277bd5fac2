"""Client-update engines compared: client updates per second of each, as a ratio to the sequential loop.

Workloads (``--workload``), all FedAvg through `pflkit.fl.loop.run_rounds` (no validation or test pass):

* ``cifar`` (default): the CIFAR-10 subset, IID over ``--clients`` clients, ``--per-round`` sampled per
  round, batch 32, ``--local-epochs`` local epochs, with LeNet (the workload of ``benchmarks/engine.py``)
  or the CIFAR ResNet-18;
* ``host``: sklearn digits, an MLP with 16 hidden units, batch 32, 10 local epochs, every client
  sampled (10 and 50 clients), one intra-op thread: a model whose arithmetic is negligible, so what is
  timed is the host's cost per step (Python, dispatch), which also bounds a GPU at LeNet's size;
* ``pfl``: pfl-research's published CIFAR-10 benchmark (1000 clients, 50 per round, batch 10, one local
  epoch; LeNet here), in client updates per second, comparable across libraries. The bundled
  CIFAR-10 subset (10,000 training images) leaves each of 1000 clients a handful of images, so on it
  a client's update is one or two steps; ``--clients`` / ``--per-round`` shrink it for a quick run.

Every engine trains the same rounds in this one process; the engines run interleaved, ``--repeat``
times, and the medians are printed:

* ``sequential``: one client after the other, torch's default intra-op threads (all cores; one for
  ``host`` or with ``--threads 1``);
* ``threads`` (CPU only): the round's clients in a pool of worker threads, one intra-op thread
  each (`pflkit.fl.engines.run_threads`);
* ``vectorized``: the round's clients trained together, one ``torch.func.vmap`` over their
  stacked weights per step (`pflkit.fl.vectorized`).

A column is the median over repeats of (clients per round / median seconds of a warm round,
rounds 2..R); the ratio is that over the sequential column. "per CPU s" is the same with the
processor seconds of the rounds' client updates (all threads of the process): on a shared machine,
time spent waiting for a core inflates wall-clock seconds, not these. Peak memory: on CUDA the peak of
``torch.cuda.max_memory_allocated`` during the run; on the CPU the peak growth of the process's
resident memory (sampled every 5 ms). The script checks that the engines end with the same
server state as the sequential loop (threads: bitwise when the sequential loop runs one
intra-op thread, as each worker does; vectorized: within 10x the drift of a sequential run from a
start one ulp off, i.e. float rounding as training amplifies it) and prints the load
average, since the machines these numbers come from are shared.

    PYTHONPATH=. python benchmarks/vectorized.py --workload host                 # the host's cost per step
    PYTHONPATH=. python benchmarks/vectorized.py --workload pfl --repeat 1 --rounds 3   # pfl-research's
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
MODELS = {"lenet": "lenet", "resnet18": "resnet18_cifar", "mlp": "mlp"}
ROUNDING_FACTOR = 10  # how far past the rounding drift (`compare`) the vectorized state may end


# the workloads (--workload): dataset, model and its options, batch size, local epochs, default clients in
# the federation and per round; ``host``: a model whose arithmetic is negligible, so the engines' host cost
# (Python, dispatch) is what is timed; ``pfl``: pfl-research's published CIFAR-10 benchmark (1000 clients,
# 50 per round, batch 10, one local epoch)
WORKLOADS = {
    "cifar": {"dataset": "cifar10", "batch_size": 32, "local_epochs": 1, "clients": 100, "per_round": "10"},
    "host": {"dataset": "digits", "model": "mlp", "options": {"hidden": [16]}, "batch_size": 32,
             "local_epochs": 10, "clients": 0, "per_round": "10,50"},
    "pfl": {"dataset": "cifar10", "batch_size": 10, "local_epochs": 1, "clients": 1000, "per_round": "50"},
}


def workload(a, model: str, per_round: int) -> dict:
    """The experiment (as ``benchmarks/engine.py`` builds it) for one model and clients per round; the
    federation has ``a.clients`` clients, or ``per_round`` (every client sampled) when that is 0."""
    w = WORKLOADS[a.workload]
    clients = max(a.clients, per_round)
    return {"experiment": {"name": "bench_vectorized"},
            "data": {"dataset": a.dataset or w["dataset"], "scheme": "iid", "num_clients": clients},
            "model": {"name": MODELS.get(model, model), "options": dict(w.get("options", {}))},
            "methods": {"FedAvg": {"algorithm": "fedavg", "rounds": a.rounds, "fraction": per_round / clients,
                                   "local_epochs": a.local_epochs, "lr": 0.01, "batch_size": w["batch_size"],
                                   "eval_every": 0, "keep_best": False}}}


def prepare(a, model: str, per_round: int):
    """(algorithm, its config, federation, env) of the workload, built once for every engine."""
    from pflkit.algorithms import get_algorithm
    from pflkit.data.datasets import load_dataset
    from pflkit.run.experiments import resolve
    from pflkit.fl.federate import federation_for
    from pflkit.run.environment import make_env

    cfg = resolve(workload(a, model, per_round), "cpu", [f"device={a.device}"] if a.device != "auto" else [])
    data = a.dataset or WORKLOADS[a.workload]["dataset"]
    fed = federation_for(cfg.data, load_dataset(data, a.data_root or None), cfg.seed)
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


class RoundCPU:
    """Processor seconds (all threads of this process, `time.process_time`) of each round's client
    updates: on a machine shared with other jobs, waiting for a core inflates wall-clock time, not these."""

    def __enter__(self):
        from pflkit.fl import transport

        self.seconds, self._real = [], transport.train_clients

        def timed(*args, **kw):
            t = time.process_time()
            try:
                return self._real(*args, **kw)
            finally:
                self.seconds.append(time.process_time() - t)
        transport.train_clients = timed
        return self

    def __exit__(self, *exc):
        from pflkit.fl import transport

        transport.train_clients = self._real
        return False


def run_engine(name: str, algo, cfg, fed, env, nudge: bool = False) -> tuple[float, dict, int, float]:
    """(client updates per second over the warm rounds, final server state, peak bytes, client updates per
    processor second of the warm rounds' client updates (`RoundCPU`)) of one engine; ``nudge``: from the
    start moved one ulp (`nudged`)."""
    import torch

    from pflkit.fl.loop import run_rounds

    run_env = dataclasses.replace(env, engine=name, _scratch={})
    run_env.seed_torch("init")
    model = nudged(run_env.model_fn()) if nudge else run_env.model_fn()
    with PeakMemory(torch.device(env.device)) as mem, RoundCPU() as cpu:
        result = run_rounds(algo, cfg, fed, model, run_env, test=False)
    assert result.status == "ok" and result.engine == name, (result.status, result.engine, result.error)
    warm = [row["seconds"] for row in result.history[1:]] or [result.history[0]["seconds"]]
    per_round = cfg.fraction * fed.num_clients
    return (per_round / statistics.median(warm), result.state, mem.peak,
            per_round / statistics.median(cpu.seconds[1:] or cpu.seconds))


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
    cpus: dict[str, list[float]] = {e: [] for e in engines}
    states: dict[str, dict] = {}
    for r in range(a.repeat):
        for e in engines:
            rate, states[e], peak, cpu = run_engine(e, algo, cfg, fed, env)
            rates[e].append(rate)
            peaks[e].append(peak)
            cpus[e].append(cpu)
            print(f"  repeat {r + 1} {e:>10}: {rate:8.2f} client updates/s, {cpu:8.2f} per CPU second, peak "
                  f"{peak / 2**20:7.1f} MiB")
    base, cpu_base = statistics.median(rates[engines[0]]), statistics.median(cpus[engines[0]])
    print(f"{'engine':>12} {'updates/s':>10} {'ratio':>7} {'per CPU s':>10} {'ratio':>7} {'peak MiB':>9}  (medians "
          f"of {a.repeat}; ratios to {engines[0]}; per CPU s: client updates per processor second)")
    for e in engines:
        med, cpu = statistics.median(rates[e]), statistics.median(cpus[e])
        print(f"{e:>12} {med:10.2f} {med / base:6.2f}x {cpu:10.2f} {cpu / cpu_base:6.2f}x {max(peaks[e]) / 2**20:9.1f}")
    # the same numbers: the threads engine runs one intra-op thread per worker, so the sequential loop
    # at one thread gives its state bitwise; the vectorized engine batches the same float operations
    # differently, so its state agrees up to float rounding as local SGD amplifies it: at most
    # ROUNDING_FACTOR times the drift of a sequential run whose start is one ulp off (deep BatchNorm
    # nets amplify a lot: ResNet-18's one-ulp twin ends ~1e-3 away after five steps)
    with intra_op_threads(1):
        one_thread = run_engine("sequential", algo, cfg, fed, env)[1]
        one_ulp = run_engine("sequential", algo, cfg, fed, env, nudge=True)[1]
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
    ap.add_argument("--workload", choices=tuple(WORKLOADS), default="cifar",
                    help="cifar: FedAvg on CIFAR-10, batch 32 (the default); host: FedAvg on digits with an MLP of "
                         "16 hidden units, batch 32, 10 local epochs, every client sampled, one intra-op thread (the "
                         "host's cost per step); pfl: pfl-research's CIFAR-10 benchmark (1000 clients, 50 per round, "
                         "batch 10, one local epoch), in client updates per second")
    ap.add_argument("--dataset", default=None, help="the workload's dataset unless given")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--models", default=None, help="lenet, resnet18, mlp (default: the workload's: mlp for host, "
                                                   "else lenet; on CUDA lenet,resnet18)")
    ap.add_argument("--per-round", default=None, help="clients per round, comma-separated (default: the workload's; "
                                                     "on CUDA for cifar 10,50,100)")
    ap.add_argument("--clients", type=int, default=None, help="clients in the federation (at least --per-round; "
                                                             "default: the workload's, host: --per-round)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run (the first is a warm-up)")
    ap.add_argument("--local-epochs", type=int, default=None, help="default: the workload's")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, interleaved; medians are reported")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of the whole run (0: torch's "
                                                          "default; the host workload: 1)")
    ap.add_argument("--engines", default=None, help="compared with sequential (always run; default: threads and "
                                                   "vectorized on a CPU, vectorized on CUDA and for host)")
    ap.add_argument("--tf32", choices=("default", "off"), default="default",
                    help="off: full-fp32 convolutions and matmuls on CUDA (torch's default lets cuDNN convolve in "
                         "TF32, a 10-bit mantissa)")
    a = ap.parse_args(argv)
    import torch

    if a.tf32 == "off":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    w, host = WORKLOADS[a.workload], a.workload == "host"
    a.clients = w["clients"] if a.clients is None else a.clients
    a.local_epochs = w["local_epochs"] if a.local_epochs is None else a.local_epochs
    if a.threads or host:
        torch.set_num_threads(a.threads or 1)
    cuda = a.device.startswith("cuda") or (a.device == "auto" and torch.cuda.is_available())
    models = (a.models or ("mlp" if host else "lenet,resnet18" if cuda and a.workload == "cifar" else "lenet")).split(",")
    per_round = [int(n) for n in (a.per_round or ("10,50,100" if cuda and a.workload == "cifar" else w["per_round"])
                                  ).split(",")]
    engines = ["sequential"] + [e for e in (a.engines or ("vectorized" if cuda or host else "threads,vectorized")
                                            ).split(",") if e != "sequential"]
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
