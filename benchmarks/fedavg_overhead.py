"""pflkit's round-loop overhead against a minimal hand-written FedAvg round, in one process.

Both sides do the same work: the same sampled clients, the same local SGD (one epoch,
same batch size, same per-batch uint8 -> float conversion), the same sample-weighted
average. Rounds alternate between the two implementations so machine noise hits both
alike; the script prints median seconds per round and the ratio pflkit / hand-written
(target: at most 1.10), with and without pflkit's per-round checkpoint.

    python benchmarks/fedavg_overhead.py                 # CIFAR-10 subset if found, else digits
    python benchmarks/fedavg_overhead.py --dataset digits --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pflkit.algorithms import ALGORITHMS
from pflkit.data.base import to_float
from pflkit.data.datasets import load_dataset
from pflkit.fl.algorithm import Env
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.fl.sampling import SamplingRule, sample_clients
from pflkit.models import build_model


def hand_round(model, global_state, fed, ids, lr, batch_size, seed, round_index):
    """The reference: load, train one epoch with plain SGD, average by sample count."""
    states, sizes = [], []
    for cid in ids:
        client = fed.clients[cid]
        model.load_state_dict(global_state)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        model.train()
        gen = torch.Generator().manual_seed(seed * 1_000_003 + round_index * 1009 + cid)
        idx = client.splits["train"][torch.randperm(client.num("train"), generator=gen).numpy()]
        for s in range(0, len(idx), batch_size):
            t = torch.as_tensor(idx[s:s + batch_size])
            xb, yb = to_float(fed.x[t], fed.meta), fed.y[t]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(client.num("train"))
    total = sum(sizes)
    return {k: sum(s[k].double() * n for s, n in zip(states, sizes)).div(total).to(v.dtype) if v.is_floating_point()
            else v for k, v in states[0].items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=None, help="cifar10 (default when found) or digits")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per implementation")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.dataset
    if name is None:
        default_root = Path(__file__).resolve().parents[2] / "shared" / "data"
        args.data_root = args.data_root or (str(default_root) if default_root.is_dir() else None)
        try:
            ds = load_dataset("cifar10", args.data_root)
            name = "cifar10"
        except FileNotFoundError:
            ds, name = load_dataset("digits"), "digits"
    else:
        ds = load_dataset(name, args.data_root)
    fed = build_federation(ds, "dirichlet", args.clients, seed=0, alpha=1.0)
    model_name = "lenet" if name != "digits" else "digits_cnn"
    env = Env(model_fn=lambda: build_model(model_name, num_classes=fed.num_classes, input_shape=tuple(fed.x.shape[1:])))
    algo = ALGORITHMS["fedavg"]
    cfg = algo.make_config({"rounds": 1, "fraction": args.per_round / args.clients, "lr": 0.01, "batch_size": 32,
                            "eval_every": 0, "keep_best": False})
    env.seed_torch("init")
    start = env.model_fn()
    w0 = {k: v.clone() for k, v in start.state_dict().items()}
    hand_model = env.model_fn()
    timings = {"hand": [], "pflkit": [], "pflkit+ckpt": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # the first round of each is warm-up
            ids = sample_clients(fed.num_clients, SamplingRule.of(cfg), env, 0)
            t = time.perf_counter()
            hand_round(hand_model, w0, fed, ids, cfg.lr, cfg.batch_size, 0, 0)
            th = time.perf_counter() - t
            start.load_state_dict(w0)
            t = time.perf_counter()
            run_rounds(algo, cfg, fed, start, env, test=False)
            tp = time.perf_counter() - t
            start.load_state_dict(w0)
            t = time.perf_counter()
            run_rounds(algo, cfg, fed, start, env, test=False, checkpoint=Path(tmp) / "c.ckpt")
            tc = time.perf_counter() - t
            if r:
                timings["hand"].append(th)
                timings["pflkit"].append(tp)
                timings["pflkit+ckpt"].append(tc)
    med = {k: statistics.median(v) for k, v in timings.items()}
    print(f"dataset={name} model={model_name} clients={args.clients} per_round={args.per_round} "
          f"torch_threads={torch.get_num_threads()} rounds={args.rounds}")
    for k, v in med.items():
        print(f"{k:12s} median {v * 1000:8.1f} ms/round")
    print(f"ratio pflkit / hand-written:        {med['pflkit'] / med['hand']:.3f}  (target <= 1.10)")
    print(f"ratio pflkit+checkpoint / hand:     {med['pflkit+ckpt'] / med['hand']:.3f}")
    return med


if __name__ == "__main__":
    main()
