"""Round engines compared: pflkit's loop, pflkit on Flower, a hand-written Flower app, a plain PyTorch loop.

One workload (FedAvg, 100 clients of the CIFAR-10 subset, 10 per round, LeNet, 20 rounds,
one local epoch, then every client's test split), four engines, each in its own child
process started by this script, one after another:

* ``plain``: a hand-written PyTorch loop (load, SGD epoch, weighted average) - the floor;
* ``pflkit``: ``pflkit.run.runner.run_experiment`` (the round loop, results files);
* ``flower``: ``pflkit.flower.run_flower`` (``flwr.simulation.run_simulation``, Ray actors);
* ``flower_app``: a hand-written Flower app with Flower's own FedAvg strategy and a plain
  training ClientApp: what pflkit on Flower should not be slower than.

The parent samples the resident memory of each child's whole process tree (Ray's
processes included) every 0.2 s and prints, per engine, the wall time end to end (start
of the child to its end: imports, data, Ray start-up included), the median seconds of a
warm round (rounds 2..R), and the peak memory, each also as a ratio to ``plain``. With
``--repeat N`` the engines run N times, interleaved, and the medians are reported (the
machine these numbers come from is shared: single runs vary by 1.5x).

    nice -n 10 python benchmarks/engine.py --data-root "$PFLKIT_DATA" --repeat 2
    python benchmarks/engine.py --rounds 3 --engines plain,pflkit      # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

ENGINES = ("plain", "pflkit", "flower", "flower_app")


def experiment(a) -> dict:
    """The workload as a pflkit experiment (every engine builds its clients from it)."""
    return {"experiment": {"name": "bench_engine"},
            "data": {"dataset": a.dataset, "scheme": "iid", "num_clients": a.clients},
            "model": {"name": "lenet"},
            "methods": {"FedAvg": {"algorithm": "fedavg", "rounds": a.rounds, "fraction": a.per_round / a.clients,
                                   "local_epochs": 1, "lr": 0.01, "batch_size": 32, "eval_every": 0,
                                   "keep_best": False}}}


def _federation(a):
    from pflkit.data.datasets import load_dataset
    from pflkit.run.experiments import resolve
    from pflkit.fl.federate import federation_for

    cfg = resolve(experiment(a), "cpu")
    return cfg, federation_for(cfg.data, load_dataset(a.dataset, a.data_root or None), cfg.seed)


def _sgd_epoch(model, client, batch_size, lr, gen):
    """One plain epoch of SGD on a client's train split (uint8 -> float per batch, as pflkit)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    idx = client.splits["train"][torch.randperm(client.num("train"), generator=gen).numpy()]
    for s in range(0, len(idx), batch_size):
        xb, yb = client.take(idx[s:s + batch_size])
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


def _accuracy(model, client) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        x, y = client.tensors("test")
        return float((model(x).argmax(1) == y).float().mean()) if len(y) else float("nan")


def run_plain(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    cfg, fed = _federation(a)
    torch.manual_seed(0)
    model = _lenet(fed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gen, rounds = torch.Generator().manual_seed(0), []
    for t in range(a.rounds):
        t0 = time.perf_counter()
        ids = torch.randperm(fed.num_clients, generator=gen)[: a.per_round].tolist()
        acc, total = None, 0
        for cid in ids:
            model.load_state_dict(state)
            _sgd_epoch(model, fed.clients[cid], 32, 0.01, gen)
            n = fed.clients[cid].num("train")
            new = {k: v.detach().double() * n for k, v in model.state_dict().items()}
            acc = new if acc is None else {k: acc[k] + new[k] for k in acc}
            total += n
        state = {k: (acc[k] / total).to(v.dtype) for k, v in state.items()}
        rounds.append(time.perf_counter() - t0)
    model.load_state_dict(state)
    accs = [_accuracy(model, c) for c in fed.clients]
    return {"round_seconds": rounds, "acc": statistics.fmean(accs)}


def _lenet(fed):
    from pflkit.models import build_model

    return build_model("lenet", num_classes=fed.num_classes, input_shape=tuple(fed.x.shape[1:]))


def run_pflkit(a) -> dict:
    import torch

    from pflkit.run.experiments import resolve
    from pflkit.run.runner import run_experiment

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as out:
        res = run_experiment(resolve(experiment(a), "cpu"), out, data_root=a.data_root, progress=False)
    return {"round_seconds": [r["seconds"] for r in res["rounds"]["FedAvg"]["seed0"]],
            "acc": res["methods"]["FedAvg"]["acc_mean"] / 100}


def run_flower_engine(a) -> dict:
    from pflkit.run.experiments import resolve
    from pflkit.flower.simulation import run_flower

    with tempfile.TemporaryDirectory() as out:
        res = run_flower(resolve(experiment(a), "cpu"), out, data_root=a.data_root, num_cpus=a.ray_cpus,
                         client_cpus=a.threads)
    return {"round_seconds": [r["seconds"] for r in res["rounds"]["FedAvg"]["seed0"]],
            "acc": res["methods"]["FedAvg"]["acc_mean"] / 100}


@lru_cache(maxsize=1)
def _client_federation(dataset: str, data_root: str, clients: int):
    """The hand-written app's clients (cached per Ray worker process)."""
    a = argparse.Namespace(dataset=dataset, data_root=data_root, clients=clients, rounds=1, per_round=1)
    return _federation(a)[1]


def hand_client_app():
    """A plain ClientApp: load arrays, one SGD epoch, reply arrays and the sample count."""
    import torch
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def client_of(msg, context):
        c = msg.content["config"]
        torch.set_num_threads(int(c["threads"]))
        fed = _client_federation(str(c["dataset"]), str(c["data-root"]), int(c["clients"]))
        model = _lenet(fed)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model, fed.clients[int(context.node_config["partition-id"])]

    @app.train()
    def train(msg, context):
        model, c = client_of(msg, context)
        _sgd_epoch(model, c, 32, 0.01, torch.Generator().manual_seed(int(msg.metadata.group_id or 0)))
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": c.num("train")})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg, context):
        model, c = client_of(msg, context)
        return Message(RecordDict({"metrics": MetricRecord({"acc": _accuracy(model, c)})}), reply_to=msg)

    return app


def run_flower_app(a) -> dict:
    """A hand-written Flower app: Flower's FedAvg strategy and `hand_client_app`."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from pflkit.flower.simulation import ray_backend_config
    from pflkit.models import build_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import engine as bench  # by module name, so that Ray workers import it instead of unpickling copies

    server, out = ServerApp(), {"rounds": []}
    config = ConfigRecord({"dataset": a.dataset, "data-root": a.data_root or "", "clients": a.clients,
                           "threads": a.threads})

    class TimedFedAvg(FedAvg):
        def configure_train(self, server_round, arrays, config, grid):
            out["t0"] = time.perf_counter()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            res = super().aggregate_train(server_round, replies)
            out["rounds"].append(time.perf_counter() - out["t0"])
            return res

    @server.main()
    def main(grid, context):
        torch.manual_seed(0)
        model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32))
        strategy = TimedFedAvg(fraction_train=a.per_round / a.clients, fraction_evaluate=0.0,
                               min_available_nodes=a.clients)
        result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=a.rounds, train_config=config)
        msgs = [Message(RecordDict({"arrays": result.arrays, "config": config}), dst_node_id=n,
                        message_type="evaluate") for n in grid.get_node_ids()]
        accs = [r.content["metrics"]["acc"] for r in grid.send_and_receive(msgs) if r.has_content()]
        out["acc"] = statistics.fmean(accs)

    run_simulation(server, bench.hand_client_app(), num_supernodes=a.clients,
                   backend_config=ray_backend_config(a.threads, a.ray_cpus))
    return {"round_seconds": out["rounds"], "acc": out["acc"]}


RUNNERS = {"plain": run_plain, "pflkit": run_pflkit, "flower": run_flower_engine, "flower_app": run_flower_app}


def tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(engine: str, argv: list[str]) -> dict:
    """Run one engine in a child process; wall time and peak tree memory seen from here."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_file = f.name
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, __file__, *argv, "--child", engine, "--result", result_file])
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(child.pid))
            done.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = child.wait()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if rc != 0:
        raise SystemExit(f"engine {engine} failed with exit code {rc}")
    res = json.loads(Path(result_file).read_text())
    os.unlink(result_file)
    warm = res["round_seconds"][1:] or res["round_seconds"]
    return {"engine": engine, "wall": wall, "round": statistics.median(warm), "peak_gb": peak[0] / 2**30,
            "acc": res["acc"]}


def report(rows: list[dict]) -> None:
    base = next((r for r in rows if r["engine"] == "plain"), rows[0])
    print(f"\n{'engine':12s} {'end-to-end s':>12s} {'x':>6s} {'warm round s':>13s} {'x':>6s} "
          f"{'peak GB':>8s} {'x':>6s} {'acc':>6s}")
    for r in rows:
        print(f"{r['engine']:12s} {r['wall']:12.1f} {r['wall'] / base['wall']:6.2f} {r['round']:13.3f} "
              f"{r['round'] / base['round']:6.2f} {r['peak_gb']:8.2f} {r['peak_gb'] / base['peak_gb']:6.2f} "
              f"{r['acc']:6.3f}")
    by = {r["engine"]: r for r in rows}
    if "flower" in by and "flower_app" in by:
        f, h = by["flower"], by["flower_app"]
        print(f"\npflkit on Flower / hand-written Flower app: end to end {f['wall'] / h['wall']:.2f}x, "
              f"warm round {f['round'] / h['round']:.2f}x, peak memory {f['peak_gb'] / h['peak_gb']:.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", default=None, help="folder with cifar10_small.npz (else pflkit's search)")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and Ray CPUs) per client")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count(), help="CPUs Ray may use")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeat", type=int, default=1, help="runs per engine, interleaved; medians are reported")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        Path(a.result).write_text(json.dumps(RUNNERS[a.child](a)))
        return
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose from {ENGINES}")
    passed = [x for x in (argv if argv is not None else sys.argv[1:])]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    for rep in range(a.repeat):  # engines interleaved, so that a busy machine slows all of them alike
        for e in engines:
            print(f"running {e} ({rep + 1}/{a.repeat}) ...", flush=True)
            runs[e].append(measure(e, passed))
            print(f"  {runs[e][-1]}", flush=True)
    report([{"engine": e, **{k: statistics.median(r[k] for r in rs) for k in ("wall", "round", "peak_gb", "acc")}}
            for e, rs in runs.items()])


if __name__ == "__main__":
    main()
