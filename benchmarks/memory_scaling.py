"""Peak memory of one round of pFedHN and of FedL2P's meta-update, as clients and model size grow.

FedL2P's App. C argues that pFedHN's server memory grows with (number of clients x model
size) while FedL2P's does not. This script measures both, one configuration per fresh
subprocess so that peaks do not leak between points:

* pFedHN: building the server state (hypernetwork with embedding dim 1 + n/4, heads for
  every target tensor) and one full round (broadcast, 50 local steps, VJP + server SGD);
* FedL2P: the server state (meta-nets) and one client's meta-update (fine-tuning, IFT
  hypergradient with a Neumann series, Alg. 1 lines 6-12), then the server average.

Targets: pFedHN's LeNet (``lenet``, BatchNorm for FedL2P, which needs BN layers) of first-layer
width 8 .. 64 on 3x32x32 inputs, synthetic data (16 images per client). Memory is the peak
resident set (Linux VmHWM, reset after setup with /proc/self/clear_refs) above the resident
set at the reset, so it counts what the round allocates, not the interpreter or the data.
Also printed: the bytes of the state the server keeps between rounds.

Usage:
    python benchmarks/memory_scaling.py                 # both curves, printed as tables
    python benchmarks/memory_scaling.py --clients 10,100,1000 --widths 8,32 --out mem.json --plot mem.png
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def _reset_peak() -> int:
    """Reset VmHWM to the current RSS; returns that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib("VmRSS")


def _tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _federation(num_clients: int, per_client: int = 16):
    import torch

    from pflkit.data.base import Dataset, DatasetMeta
    from pflkit.fl.federate import build_federation

    g = torch.Generator().manual_seed(0)
    n = num_clients * per_client
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    meta = DatasetMeta("synthetic", 10, tuple(map(str, range(10))), (3, 32, 32), (0.5,) * 3, (0.25,) * 3)
    return build_federation(Dataset(meta, x, y, x[:0], y[:0], {}, {}), "iid", num_clients, seed=0)


def measure(method: str, num_clients: int, width: int) -> dict:
    """One round of ``method`` with ``num_clients`` clients and a LeNet of ``width``; in this process."""
    import torch

    from pflkit.algorithms import get_algorithm
    from pflkit.fl.algorithm import Env
    from pflkit.models import build_model

    torch.set_num_threads(1)
    fed = _federation(num_clients)
    bn = method == "fedl2p"
    env = Env(model_fn=lambda: build_model("lenet", num_classes=10, input_shape=(3, 32, 32), width=width, bn=bn))
    env.seed_torch("init")
    model = env.model_fn()
    if method == "pfedhn":
        algo = get_algorithm("pfedhn")
        cfg = algo.make_config({"rounds": 1, "eval_every": 0, "batch_size": 16})
    else:
        algo = get_algorithm("fedl2p")
        cfg = algo.make_config({"rounds": 1, "epochs": 1, "meta_iters": 1, "batch_size": 16, "val_batch_size": 16})
    base = _reset_peak()
    t0 = time.perf_counter()
    state = algo.init(model, fed, cfg, env)
    msg = algo.broadcast(state, 0, cfg, env)
    update, _ = algo.client_update(msg, fed.clients[0], None, cfg, env)
    state = algo.aggregate(state, [update], cfg, env)
    seconds = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    return {"method": method, "clients": num_clients, "width": width,
            "target_params": sum(p.numel() for p in model.parameters()),
            "peak_mib": (peak - base) / 1024, "state_mib": _tensor_bytes(state) / 2**20,
            "message_mib": _tensor_bytes(msg) / 2**20, "seconds": seconds}


def _child(method: str, num_clients: int, width: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, str(num_clients), str(width)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(rows: list[dict], key: str) -> str:
    head = f"{key:>8} {'method':>7} {'target params':>14} {'peak MiB':>9} {'state MiB':>10} {'msg MiB':>8} {'s':>6}"
    lines = [head] + [f"{r[key]:>8} {r['method']:>7} {r['target_params']:>14,} {r['peak_mib']:>9.1f} "
                      f"{r['state_mib']:>10.2f} {r['message_mib']:>8.3f} {r['seconds']:>6.1f}" for r in rows]
    return "\n".join(lines)


def _plot(by_clients: list[dict], by_width: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for method in ("pfedhn", "fedl2p"):
        rc = [r for r in by_clients if r["method"] == method]
        rw = [r for r in by_width if r["method"] == method]
        ax[0].plot([r["clients"] for r in rc], [r["peak_mib"] for r in rc], marker="o", label=method)
        ax[1].plot([r["target_params"] for r in rw], [r["peak_mib"] for r in rw], marker="o", label=method)
    ax[0].set_xscale("log")
    ax[0].set_xlabel(f"clients (LeNet width {by_clients[0]['width']})")
    ax[1].set_xscale("log")
    ax[1].set_xlabel(f"target parameters ({by_width[0]['clients']} clients)")
    for a in ax:
        a.set_ylabel("peak memory of one round (MiB)")
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,50,100,500,1000", help="client counts (width fixed to 16)")
    parser.add_argument("--widths", default="8,16,32,64", help="LeNet widths (clients fixed to 50)")
    parser.add_argument("--methods", default="pfedhn,fedl2p")
    parser.add_argument("--out", default=None, help="write all rows as JSON here")
    parser.add_argument("--plot", default=None, help="save the two curves as an image here")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "CLIENTS", "WIDTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    methods = args.methods.split(",")
    by_clients = [_child(m, int(n), 16) for n in args.clients.split(",") for m in methods]
    print("peak memory vs number of clients (LeNet width 16)\n" + _table(by_clients, "clients") + "\n")
    by_width = [_child(m, 50, int(w)) for w in args.widths.split(",") for m in methods]
    print("peak memory vs target size (50 clients)\n" + _table(by_width, "width"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"by_clients": by_clients, "by_width": by_width}, f, indent=2)
    if args.plot:
        _plot(by_clients, by_width, args.plot)


if __name__ == "__main__":
    main()
