"""What one message costs a SuperNode before any training: a new ``flwr-clientapp`` process.

Flower 1.42 runs every message of a deployment in a fresh ``flwr-clientapp`` process: its
``run_clientapp`` pulls one message with a per-execution token, calls the ClientApp once,
pushes the reply and exits (also with ``--isolation process``, where the process is started
by something else but still serves one token). So each message pays, in order:

* ``python``: the interpreter starting;
* ``flwr``: Flower's ClientApp runtime imported (``flwr.supernode.runtime.run_clientapp``);
* ``pflkit app``: pflkit's ClientApp loaded (``pflkit.flower.app``: torch and the algorithms);
* ``data``: the experiment's dataset read and its federation built (`pflkit.flower.runtime.runtime`).

Each row is a child process doing the steps up to it, timed end to end, median of ``--repeat``
runs, one thread each; the rows are cumulative, differences are the step's own cost.

    PFLKIT_OFFLINE=1 python benchmarks/clientapp_start.py --experiment demo --preset smoke
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STEPS = {
    "python": "pass",
    "flwr": "import flwr.supernode.runtime.run_clientapp",
    "pflkit app": "import flwr.supernode.runtime.run_clientapp; import pflkit.flower.app",
    "data": ("import flwr.supernode.runtime.run_clientapp; import pflkit.flower.app\n"
             "from pflkit.run.experiments import resolve\n"
             "from pflkit.flower.runtime import runtime, settings_for\n"
             "s = settings_for(resolve({experiment!r}, {preset!r}, [{overrides!r}] if {overrides!r} else []))\n"
             "runtime(s['experiment-json'], s['preset'], '', 0)"),
}


def seconds(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="demo")
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--overrides", default="data.num_clients=4")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: must be >= 1")
    codes = {k: v.format(experiment=args.experiment, preset=args.preset, overrides=args.overrides)
             for k, v in STEPS.items()}
    runs = {k: [] for k in codes}
    for _ in range(args.repeat):  # interleaved: the machine's load moves
        for k, code in codes.items():
            runs[k].append(seconds(code))
    before = 0.0
    print(f"{'up to':<12}{'seconds':>9}{'step':>8}")
    for k, ts in runs.items():
        med = statistics.median(ts)
        print(f"{k:<12}{med:9.2f}{med - before:8.2f}")
        before = med


if __name__ == "__main__":
    main()
