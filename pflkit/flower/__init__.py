"""pflkit on Flower: the same algorithm phases inside a Flower ClientApp and ServerApp.

* `records`: pflkit messages / payloads <-> Flower RecordDicts (`to_record`, `from_record`);
* `client_app`: the ClientApp (``client_update`` and ``evaluate`` on the node's partition,
  client state in ``Context.state``);
* `server_app`: `PflkitStrategy` (Flower's Strategy over ``broadcast`` / ``aggregate``);
* `nodes`: `NodeMap` (which node serves which client; the start-up wait for nodes);
* `failures`: one-line reasons of client failures, their full text in a log;
* `serve`: a whole experiment (every seed and stage) from a ServerApp, and that ServerApp
  (`build_server_app`);
* `simulation`: `run_flower` (``flwr.simulation.run_simulation``, or in-process);
* `app`: the entry points of ``flwr run .``.

Importing this package needs ``flwr`` (``pip install -e ".[flower]"``).
"""
from pflkit.flower.records import from_record, to_record

__all__ = ["from_record", "to_record", "run_flower", "build_client_app", "build_server_app", "PflkitStrategy"]


def __getattr__(name):  # the heavier parts load on first use
    if name == "run_flower":
        from pflkit.flower.simulation import run_flower

        return run_flower
    if name == "build_client_app":
        from pflkit.flower.client_app import build_client_app

        return build_client_app
    if name == "build_server_app":
        from pflkit.flower.serve import build_server_app

        return build_server_app
    if name == "PflkitStrategy":
        from pflkit.flower.server_app import PflkitStrategy

        return PflkitStrategy
    raise AttributeError(f"module 'pflkit.flower' has no attribute {name!r}")
