"""The client side: a Flower `ClientApp` that runs any pflkit algorithm's client phases.

Three message handlers (Flower's Message API):

* ``query``: reports the node's ``partition-id`` (``context.node_config``) so the
  server can map pflkit client ids to Flower node ids;
* ``train``: decodes the server's message, runs ``algo.respond`` (``client_update`` inside the
  participation protocol) on partition ``partition-id`` of the pflkit federation and replies
  with the update's payload;
* ``evaluate``: runs the algorithm's evaluation from its view of the server state
  (`Algorithm.eval_view` / `Algorithm.evaluate_view`) on the ``val`` or ``test`` split.

Per-client state that must survive rounds (personal heads, masks, posteriors, the
client's lambda in L2P) is kept in ``context.state`` under the stage's namespace,
one version per round it changed: keep-best evaluates a client with its state as of
the best round, as `pflkit.fl.loop.run_rounds` does with its deep copies. With a state
folder (node config ``state-dir``, or the run's ``client-state-dir``) the versions are
also files, so a stopped run resumed from its last checkpoint finds each client's state
as of that round. Message
parts that the server marks as unchanged since this node last received them (FedL2P's
pretrained theta_g) are read from ``context.state`` instead of travelling again.

Seeds are the loop's: ``env.seed_torch("client", cid, round)`` before an update,
``env.seed_torch("eval", cid, split)`` before an evaluation, and the algorithms draw
from ``env.generator(..., cid, round)``, so a client computes the same numbers here
as in a single-process run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflkit.fl.train import Diverged
from pflkit.flower import records
from pflkit.flower.runtime import find_stage, runtime, set_threads
from pflkit.io import load_torch, save_torch
from pflkit.kernels import use_backend

log = logging.getLogger(__name__)

HEADER, MSG, PAYLOAD, METRICS = "pflkit", "msg", "payload", "metrics"
_THREADS_SET = []  # once per process (a Ray actor serves many virtual clients)


class CacheMiss(RuntimeError):
    """The server referred to a message part this node does not hold (it is resent next time)."""


def partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no `partition-id` in its node config; start it with "
                         "--node-config \"partition-id=I num-partitions=N\"")
    return int(context.node_config["partition-id"])


def _header(msg: Message) -> dict:
    return dict(msg.content[HEADER])


def _prepare(msg: Message, context: Context, faults: dict | None = None):
    """Common start of train / evaluate: threads, partition check, injected faults, the runtime.

    Evaluation messages carry ``split`` in their header; training messages do not.
    """
    if not _THREADS_SET:
        set_threads(context.node_config.get("num-cpus"))
        _THREADS_SET.append(True)
    h = _header(msg)
    pid = partition_id(context)
    if int(h["cid"]) != pid:
        raise ValueError(f"message for pflkit client {h['cid']} reached the node holding partition {pid}")
    _inject(faults, h, pid)
    root = str(context.node_config.get("data-root", h.get("data-root", "")))
    rt = runtime(h["experiment-json"], h["preset"], root, int(h["seed"]))
    from pflkit.algorithms import get_algorithm  # here, not at import: a node answers queries at once

    stage = find_stage(rt.cfg, h["stage"])
    return h, pid, rt, get_algorithm(stage.algorithm), stage.config


def fault_keys(h: dict, pid: int) -> tuple[str, ...]:
    """The `faults` keys that apply to a message: ``STAGE/CID/ROUND`` (1-based) or ``STAGE/CID/*`` for
    training, ``STAGE/CID/val`` (every validation pass) or ``STAGE/CID/test`` for evaluation."""
    if "split" in h:
        return (f"{h['stage']}/{pid}/{h['split']}",)
    return f"{h['stage']}/{pid}/{int(h['round']) + 1}", f"{h['stage']}/{pid}/*"


def _inject(faults: dict | None, h: dict, pid: int) -> None:
    """Test / teaching hook: ``faults[key] = "raise" | "sleep:SECONDS"`` for the keys of `fault_keys`."""
    if not faults:
        return
    for key in fault_keys(h, pid):
        action = faults.get(key)
        if action == "raise":
            raise RuntimeError(f"injected failure of client {pid} ({key})")
        if action and action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))


# ------------------------------------------------------------------ per-client state in Context.state


def _ns(h: dict) -> str:
    return f"{h['stage']}@{h['seed']}"


def _versions(state: RecordDict, ns: str) -> list[int]:
    key = f"{ns}/cs-rounds"
    return list(state[key]["rounds"]) if key in state else []


def state_folder(context: Context, h: dict, pid: int) -> Path | None:
    """Where this node also writes its client states, so that a resumed run finds them: the node's
    ``state-dir`` (node config), else the run's ``client-state-dir`` (a simulation's shared disk); None: memory only."""
    root = context.node_config.get("state-dir") or h.get("client-state-dir") or ""
    if not root:
        return None
    ns = _ns(h)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", ns).strip("_")[:60]
    return Path(str(root)) / f"{safe}-{hashlib.sha256(ns.encode()).hexdigest()[:8]}" / f"client{pid}"


def _disk_versions(folder: Path | None) -> list[int]:
    if folder is None or not folder.is_dir():
        return []
    return sorted(int(f.stem.split("@")[1]) for f in folder.glob("cs@*.pt"))


def load_client_state(state: RecordDict, ns: str, at: int | None = None, folder: Path | None = None):
    """The client state as of round ``at`` (latest version <= at; None: the latest one), from the
    node's context or else its state folder (after a restart)."""
    rounds = [r for r in _versions(state, ns) if at is None or r <= at]
    if rounds:
        return records.get(state, f"{ns}/cs@{max(rounds)}")
    rounds = [r for r in _disk_versions(folder) if at is None or r <= at]
    return load_torch(folder / f"cs@{max(rounds)}.pt") if rounds else None


def save_client_state(state: RecordDict, ns: str, round_: int, obj, keep_from: int,
                      folder: Path | None = None) -> None:
    """Store version ``round_``; keep the versions keep-best or a resume may still read: every one after
    ``keep_from`` and the last one at or before it (``keep_from < 0``: only the latest). Versions after
    ``round_`` were left by a stopped run that this one resumed: they go."""
    records.put(state, f"{ns}/cs@{round_}", obj)
    if folder is not None:
        save_torch(folder / f"cs@{round_}.pt", obj)
    rounds = sorted(set(_versions(state, ns)) | set(_disk_versions(folder)) | {round_})
    below = [r for r in rounds if r <= keep_from]
    keep = {round_} if keep_from < 0 else {r for r in rounds if keep_from < r <= round_} | set(below[-1:])
    for r in rounds:
        if r not in keep:
            records.drop(state, f"{ns}/cs@{r}")
            if folder is not None:
                (folder / f"cs@{r}.pt").unlink(missing_ok=True)
    state[f"{ns}/cs-rounds"] = ConfigRecord({"rounds": sorted(keep & set(_versions(state, ns)) | {round_})})


def _client_state(context: Context, h: dict, pid: int, at: int | None):
    """The state this client had as of round ``at``; a client the server knows to hold one and that has
    none (a restarted node without a state folder) fails rather than starting afresh."""
    found = load_client_state(context.state, _ns(h), at, state_folder(context, h, pid))
    if found is None and int(h.get("has-state", 0)):
        raise RuntimeError(f"client {pid} has no state of stage {h['stage']!r} as of round {at}: a resumed run "
                           "needs the node's client states (node config state-dir)")
    return found


def receive(content: RecordDict, state: RecordDict, ns: str, h: dict):
    """The server's message, with the parts it sent before read back from ``state``."""
    obj = records.get(content, MSG)
    tokens_key = f"{ns}/cache-tokens"
    tokens = json.loads(state[tokens_key]["tokens"]) if tokens_key in state else {}
    for key, token in json.loads(h.get("store", "{}")).items():
        records.put(state, f"{ns}/cache/{key}", obj[key])
        tokens[key] = token
    for key, token in json.loads(h.get("hold", "{}")).items():
        if tokens.get(key) != token:
            raise CacheMiss(f"message part {key!r} (version {token}) is not cached on this node")
        obj[key] = records.get(state, f"{ns}/cache/{key}")
    state[tokens_key] = ConfigRecord({"tokens": json.dumps(tokens)})
    return obj


def _metric(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else float(v)


def _reply(msg: Message, header: dict, metrics: dict, payload=None, with_payload=False) -> Message:
    content = RecordDict({HEADER: ConfigRecord(header),
                          METRICS: MetricRecord({k: _metric(v) for k, v in metrics.items()})})
    if with_payload:
        records.put(content, PAYLOAD, payload)
    return Message(content, reply_to=msg)


# ------------------------------------------------------------------ handlers


def handle_query(msg: Message, context: Context) -> Message:
    info = {"partition-id": partition_id(context)}
    return Message(RecordDict({HEADER: ConfigRecord(info)}), reply_to=msg)


def handle_train(msg: Message, context: Context, faults: dict | None = None) -> Message:
    """``algo.respond`` on this node's partition; the client state stays in ``context.state``."""
    h, pid, rt, algo, cfg = _prepare(msg, context, faults)
    ns, t = _ns(h), int(h["round"])
    message = receive(msg.content, context.state, ns, h)
    before = _client_state(context, h, pid, t)  # as of this round (a resumed run has later versions)
    env = rt.env.at_round(t)
    env.seed_torch("client", pid, t)
    try:
        with use_backend(rt.cfg.kernels):  # the run's kernel backend, for this call only
            update, client_state = algo.respond(message, rt.fed.clients[pid], before, cfg, env)
    except Diverged as e:  # the run's outcome, not a node failure: the server stops the stage
        return _reply(msg, {"diverged": str(e)}, {})
    if client_state is not None:
        save_client_state(context.state, ns, t + 1, client_state, int(h["keep-from"]), state_folder(context, h, pid))
    header = {"client-id": int(update.client_id), "num-samples": int(update.num_samples),
              "has-state": int(client_state is not None)}
    return _reply(msg, header, update.metrics, update.payload, with_payload=True)


def handle_evaluate(msg: Message, context: Context, faults: dict | None = None) -> Message:
    """The algorithm's evaluation of this client on ``split`` (``state-round``: keep-best's round)."""
    h, pid, rt, algo, cfg = _prepare(msg, context, faults)
    view = receive(msg.content, context.state, _ns(h), h)
    at = int(h["state-round"])
    client_state = _client_state(context, h, pid, at if at >= 0 else int(h["round"]) + 1)
    env = rt.env.at_round(int(h["round"]))
    env.seed_torch("eval", pid, h["split"])
    try:
        with use_backend(rt.cfg.kernels):
            metrics = algo.evaluate_view(view, rt.fed.clients[pid], client_state, cfg, env, h["split"])
    except Diverged as e:
        return _reply(msg, {"diverged": str(e)}, {})
    return _reply(msg, {"client-id": pid}, metrics)


class ClientFailure(RuntimeError):
    """A handler raised; the text starts with the original exception's type (``"RuntimeError: ..."``).

    Flower's Ray simulation re-raises a ClientApp's exception as ``ClientAppException(str(ex))``,
    which drops the type; this keeps it in the reason the server records.
    """


def _guarded(handler, msg: Message, context: Context, *args) -> Message:
    try:
        return handler(msg, context, *args)
    except Exception as e:  # noqa: BLE001 - re-raised with its type in the text, the chain kept
        raise ClientFailure(f"{type(e).__name__}: {e}") from e


def build_client_app(faults: dict[str, str] | None = None) -> ClientApp:
    """A ClientApp running pflkit algorithms; ``faults`` injects failures (tests, teaching, see `fault_keys`)."""
    app = ClientApp()
    faults = dict(faults or {})

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return _guarded(handle_query, msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return _guarded(handle_train, msg, context, faults)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _guarded(handle_evaluate, msg, context, faults)

    return app
