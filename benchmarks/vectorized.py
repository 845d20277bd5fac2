"""Client-update engines compared: client updates per second of each, as a ratio to the sequential loop.

The workload is the LeNet one of ``benchmarks/engine.py``: FedAvg on the CIFAR-10 subset,
100 clients, 10 sampled per round, LeNet, batch 32 (``--local-epochs`` local epochs, 1 by
default as there). Every engine trains the same rounds through `pflkit.fl.loop.run_rounds`
(no validation or test pass) in this one process; the engines run interleaved, ``--repeat``
times, and the medians are printed:

* ``sequential``: one client after the other, torch's default intra-op threads (all cores);
* ``threads``: the round's clients in a pool of worker threads, one intra-op thread each
  (`pflkit.fl.engines.run_threads`).

The vectorized engine (clients batched with ``torch.func.vmap`` on a GPU) is not in pflkit
yet: when it is, it is one more entry of ``ENGINES`` below, and its column and ratio follow.

A column is the median over repeats of (clients per round / median seconds of a warm round,
rounds 2..R); the ratio is that over the sequential column. The script also checks that the
engines end with the same server state (bitwise when the sequential loop runs one intra-op
thread, as each worker does; at more threads torch's CPU reductions round differently) and
prints the load average, since the machines these numbers come from are shared.

    PYTHONPATH=. python benchmarks/vectorized.py --data-root "$PFLKIT_DATA" --repeat 5
    PYTHONPATH=. python benchmarks/vectorized.py --rounds 3 --repeat 1          # a quick look
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

ENGINES = ("sequential", "threads")  # + "vectorized" once pflkit has it


def workload(a) -> dict:
    """The experiment (as ``benchmarks/engine.py`` builds it), with this script's local epochs."""
    return {"experiment": {"name": "bench_vectorized"},
            "data": {"dataset": a.dataset, "scheme": "iid", "num_clients": a.clients},
            "model": {"name": "lenet"},
            "methods": {"FedAvg": {"algorithm": "fedavg", "rounds": a.rounds, "fraction": a.per_round / a.clients,
                                   "local_epochs": a.local_epochs, "lr": 0.01, "batch_size": 32, "eval_every": 0,
                                   "keep_best": False}}}


def prepare(a):
    """(algorithm, its config, federation, env) of the workload, built once for every engine."""
    from pflkit.algorithms import get_algorithm
    from pflkit.data.datasets import load_dataset
    from pflkit.experiments import resolve
    from pflkit.runner import build_seed_federation, make_env

    cfg = resolve(workload(a), "cpu")
    fed = build_seed_federation(cfg, load_dataset(a.dataset, a.data_root or None), cfg.seed)
    stage = cfg.methods[0]
    return get_algorithm(stage.algorithm), stage.config, fed, make_env(cfg, fed, cfg.seed)


def run_engine(name: str, algo, cfg, fed, env) -> tuple[float, dict]:
    """(client updates per second over the warm rounds, final server state) of one engine."""
    from pflkit.fl.loop import run_rounds

    run_env = dataclasses.replace(env, engine=name, _scratch={})
    run_env.seed_torch("init")
    result = run_rounds(algo, cfg, fed, run_env.model_fn(), run_env, test=False)
    assert result.status == "ok" and result.engine == name, (result.status, result.engine, result.error)
    warm = [row["seconds"] for row in result.history[1:]] or [result.history[0]["seconds"]]
    return cfg.fraction * fed.num_clients / statistics.median(warm), result.state


def max_difference(a: dict, b: dict) -> float:
    """Largest absolute difference between two FedAvg server states (0.0: bitwise equal)."""
    return max(float((a["weights"][k].double() - b["weights"][k].double()).abs().max()) for k in a["weights"])


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-root", default=os.environ.get("PFLKIT_DATA"), help="folder with cifar10_small.npz")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run (the first is a warm-up)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, interleaved; medians are reported")
    ap.add_argument("--engines", default=",".join(ENGINES), help="compared with sequential (always run)")
    a = ap.parse_args(argv)
    import torch

    engines = ["sequential"] + [e for e in a.engines.split(",") if e != "sequential"]  # the ratios' base first
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        ap.error(f"--engines: unknown {unknown[0]!r}; known: {', '.join(ENGINES)}")
    algo, cfg, fed, env = prepare(a)
    print(f"workload: FedAvg, LeNet, {a.clients} clients ({fed.clients[0].num('train')} train images on "
          f"client 0), {a.per_round} per round, {a.local_epochs} local epoch(s), batch 32, {a.rounds} rounds; "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} intra-op threads")
    print(f"load average before: {load_average()}")
    rates: dict[str, list[float]] = {e: [] for e in engines}
    states: dict[str, dict] = {}
    t0 = time.perf_counter()
    for r in range(a.repeat):
        for e in engines:
            rate, states[e] = run_engine(e, algo, cfg, fed, env)
            rates[e].append(rate)
            print(f"  repeat {r + 1} {e:>10}: {rate:7.2f} client updates/s")
    print(f"load average after: {load_average()} ({time.perf_counter() - t0:.0f} s)")
    base = statistics.median(rates[engines[0]])
    print(f"{'engine':>10} {'updates/s':>10} {'ratio':>7}  (medians of {a.repeat}; ratio to {engines[0]})")
    for e in engines:
        med = statistics.median(rates[e])
        print(f"{e:>10} {med:10.2f} {med / base:7.2f}x")
    # the same numbers: at one intra-op thread (the workers' setting) the sequential loop gives
    # the threads engine's state bitwise; at torch's default thread count its CPU reductions are
    # split differently, so the states differ by float rounding only
    from pflkit.fl.engines import intra_op_threads

    with intra_op_threads(1):
        _, one_thread = run_engine("sequential", algo, cfg, fed, env)
    for e in engines[1:]:
        default, single = max_difference(states[e], states["sequential"]), max_difference(states[e], one_thread)
        print(f"final server state, {e} vs sequential: max |difference| {default:.2g} at "
              f"{torch.get_num_threads()} intra-op threads, {single:.2g} at 1 intra-op thread")
    return 0 if all(max_difference(states[e], one_thread) == 0.0 for e in engines[1:]) else 1

if __name__ == "__main__":
    raise SystemExit(main())
