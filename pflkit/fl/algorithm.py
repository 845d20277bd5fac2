"""The shape of an algorithm: a bundle of pure phase functions over explicit state.

An `Algorithm` is not a trainer class. It names five phases that the round loop
(`pflkit.fl.loop.run_rounds`), the Flower adapter and the notebooks call:

``init(model, federation, cfg, env) -> state``
    server state from the initial (fresh or pretrained) global model.
``broadcast(state, client_id, cfg, env) -> message``
    what the server sends one client this round (FedAvg: the global weights;
    pFedHN: that client's generated weights).
``client_update(message, client, client_state, cfg, env) -> (Update, client_state)``
    local work on one client; ``client_state`` is what the client keeps across
    rounds (personal heads, masks, posteriors; None the first time).
``aggregate(state, updates, cfg, env) -> state``
    the server step.
``evaluate(state, client, client_state, cfg, env, split) -> Metrics``
    the client's (personalized) model on its ``"val"`` or ``"test"`` split.

The participation protocol (`pflkit.fl.sampling`) is not a phase: the loop and the transports call
`Algorithm.start`, `Algorithm.send` and `Algorithm.respond`, which wrap ``init``, ``broadcast`` and
``client_update`` in it, so a phase sees plain messages under every ``participation`` mode.

A variant replaces only the phase it changes: ``dataclasses.replace(FEDAVG,
name="fedprox", client_update=prox_update)``. Every phase must be a function of
its arguments only; randomness comes from ``env.generator(...)`` keyed by seed,
round and client, so a resumed or re-ordered run gives the same numbers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from pflkit.config import ConfigError, fraction, non_negative, one_of, positive, require
from pflkit.fl.sampling import SAMPLING, broadcasting, flag, roster, unflag


@dataclass(frozen=True)
class FLConfig:
    """Settings shared by every algorithm; algorithm configs subclass it.

    Attributes:
        rounds: communication rounds (0: no federated training, e.g. fine-tuning only).
        fraction: share r of clients sampled per round (FedAvg's C; FedL2P's r).
        sampling: ``"fraction"`` (round(r * C) clients without replacement) or
            ``"bernoulli"`` (each client reports with probability r; pFedMe / pFedVEM protocol).
        eval_every: rounds between validation passes (0: none during training).
        eval_clients: clients in a validation pass (0: all).
        keep_best: test the state with the best validation score (``select``).
        select: ``"val_acc"`` / ``"val_loss"`` of the validation pass, or ``"update_val_loss"``
            (``val_loss`` reported by the round's clients, FedL2P sec. 4.1, weighted by their sample
            counts) / ``"update_val_loss_mean"`` (unweighted, the authors' code; `pflkit.fl.loop._score`).
        batch_size, lr, momentum, weight_decay: local SGD settings.
        local_epochs: passes over the client's train split per round (ignored if local_steps > 0).
        local_steps: fixed number of local SGD steps per round, each on a fresh random batch.
        lr_milestones, lr_gamma: step decay of the local learning rate at these rounds.
        max_grad_norm: clip local gradients to this norm (0: no clipping).
        checkpoint_every: rounds between the stage's atomic checkpoints (the last round always
            writes one); a run stopped in between repeats at most these rounds on ``--resume``.
    """

    rounds: int = 10
    fraction: float = 0.1
    sampling: str = "fraction"
    eval_every: int = 1
    eval_clients: int = 0
    keep_best: bool = True
    select: str = "val_acc"
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_epochs: int = 1
    local_steps: int = 0
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    max_grad_norm: float = 0.0
    checkpoint_every: int = 1

    def __post_init__(self):
        require(isinstance(self.rounds, int) and self.rounds >= 0, "rounds", self.rounds, "must be an integer >= 0")
        fraction("fraction", self.fraction)
        one_of("sampling", self.sampling, set(SAMPLING))
        require(self.eval_every >= 0, "eval_every", self.eval_every, "must be >= 0")
        require(self.eval_clients >= 0, "eval_clients", self.eval_clients, "must be >= 0")
        one_of("select", self.select, {"val_acc", "val_loss", "update_val_loss", "update_val_loss_mean"})
        require(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        positive("lr", self.lr)
        non_negative("momentum", self.momentum)
        non_negative("weight_decay", self.weight_decay)
        require(self.local_epochs >= 0, "local_epochs", self.local_epochs, "must be >= 0")
        require(self.local_steps >= 0, "local_steps", self.local_steps, "must be >= 0")
        positive("lr_gamma", self.lr_gamma)
        non_negative("max_grad_norm", self.max_grad_norm)
        require(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1, "checkpoint_every",
                self.checkpoint_every, "must be an integer >= 1")

    def lr_at(self, round_index: int) -> float:
        """Local learning rate at a round, after the step decays."""
        drops = sum(1 for m in self.lr_milestones if round_index >= m)
        return self.lr * self.lr_gamma**drops


@dataclass
class Update:
    """What one client returns to the server in one round."""

    client_id: int
    num_samples: int
    payload: Any
    metrics: dict[str, float] = field(default_factory=dict)


# torch's default (global) CPU generator is one per process: whoever seeds it and then draws
# from it (a seeded model init) holds this lock, so that client updates running in worker
# threads (`pflkit.fl.engines`) cannot reseed it in between.
_TORCH_RNG = threading.RLock()


@dataclass(frozen=True)
class Env:
    """Run-time context handed to every phase: model factory, device, seeds, round.

    Immutable: `pflkit.fl.loop.run_rounds` hands each round's phases ``env.at_round(t)``,
    a copy whose ``round`` is ``t`` (sharing the module cache), so no phase can change the
    round another one sees. ``model_fn()`` builds a fresh module of the experiment's
    architecture (random init); phases load tensors into it. ``generator(*keys)`` gives a
    torch Generator seeded from the run seed and the keys (e.g. ``("client", cid, round)``).
    ``engine`` says how `run_rounds` runs a round's client updates (`pflkit.fl.engines`:
    ``"sequential"``, ``"threads"``, ``"vectorized"`` or ``"auto"``); it changes the numbers
    by float rounding at most.
    ``kernels`` is the run's kernel backend (`pflkit.kernels`), entered by `run_rounds` for
    its stage; None keeps whatever backend the caller is in.

    Thread safety (the ``threads`` engine): a client update may read the Env, draw from its
    own ``generator(...)``, use `scratch_model` / `cached` (each worker thread has its own
    cache) and build a seeded module inside ``with env.torch_rng(...)``; it must not draw
    from torch's global RNG otherwise, nor assign Env fields.
    """

    model_fn: Callable[[], nn.Module]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    round: int = 0
    kernels: str | None = None
    engine: str = "sequential"
    _scratch: dict = field(default_factory=dict, repr=False)

    def at_round(self, round_: int) -> Env:
        """This context in round ``round_`` (0-based), sharing the module cache."""
        return dataclasses.replace(self, round=int(round_))

    def with_cache(self, cache: dict) -> Env:
        """This context with ``cache`` as its module cache (a worker thread's own scratch modules)."""
        return dataclasses.replace(self, _scratch=cache)

    def derive_seed(self, *keys) -> int:
        text = "/".join(str(k) for k in (self.seed,) + keys)
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)

    def generator(self, *keys) -> torch.Generator:
        """A CPU torch.Generator seeded from (run seed, *keys)."""
        return torch.Generator().manual_seed(self.derive_seed(*keys))

    def seed_torch(self, *keys) -> None:
        """Seed torch's global RNG (dropout, init) from (run seed, *keys)."""
        with _TORCH_RNG:
            torch.manual_seed(self.derive_seed("torch", *keys))

    @contextlib.contextmanager
    def torch_rng(self, *keys):
        """Inside the block, torch's global RNG is seeded from (run seed, *keys) and this thread's alone.

        For draws that must come from the global RNG (a module's seeded initialization):
        ``with env.torch_rng("init"): model = env.model_fn()`` gives the same weights in
        every thread. Sequentially it is exactly ``env.seed_torch(*keys)`` followed by the block.
        """
        with _TORCH_RNG:
            torch.manual_seed(self.derive_seed("torch", *keys))
            yield

    def cached(self, key, build: Callable[[], Any]):
        """``self._scratch[key]``, built once with ``build()`` (under the global-RNG lock: a module's
        random init must not interleave with another thread's seeded draws)."""
        if key not in self._scratch:
            with _TORCH_RNG:
                self._scratch[key] = build()
        return self._scratch[key]

    def scratch_model(self, key: str = "model") -> nn.Module:
        """A cached module of the architecture, reused to avoid rebuilding per client."""
        return self.cached(key, lambda: self.model_fn().to(self.device))


Metrics = dict[str, float]


@dataclass(frozen=True)
class Algorithm:
    """A federated algorithm as five phase functions plus metadata.

    Attributes:
        name: registry key (``"fedavg"``).
        label: how the papers' tables print it (``"FedAvg"``).
        config: the frozen dataclass of its hyperparameters (a subclass of FLConfig).
        needs_pretrained: starts from the experiment's pretrained global model.
        exports_global: ``global_model(state)`` gives a model worth reporting / reusing.
        thread_unsafe: why ``client_update`` must not run in worker threads (the ``threads``
            engine then runs this algorithm's rounds sequentially and logs this reason);
            empty when it may (see `Env` for what that requires).
        vectorizable: ``client_update`` (and any training inside ``evaluate``) trains only
            through `pflkit.fl.train.local_sgd` and its helpers, so the ``vectorized`` engine
            may run a round's clients together (`pflkit.fl.vectorized`). Off: that engine runs
            the algorithm sequentially and logs why.
        plain_sgd: ``client_update`` itself when it is FedAvg's plain local SGD: it loads the message
            (the model's state dict) into the model, trains it with `pflkit.fl.train.round_sgd` at the
            round's settings and sends the trained state back (``Update(id, num("train"), state,
            {"loss"})``), the client state unchanged. The ``vectorized`` engine then runs a round's
            clients without a thread each (`pflkit.fl.lockstep`). A variant that replaces
            ``client_update`` inherits the field but no longer matches it, so it is not taken for one.
        report: optional ``report(state, fed, cfg, env, client_states) -> JSON-able`` with what
            the algorithm learned per client (FedL2P's beta / eta, FedSelect's masks); the
            runner stores it beside the stage's results.
        eval_view: ``eval_view(state, cid, cfg, env) -> view``, the part of the server state an
            evaluation of client ``cid`` needs (what travels to it on Flower). Default: the whole
            state (FedAvg's weights, FedL2P's theta_g and lambda); pFedHN: the client's generated
            weights (the hypernetwork stays on the server); FedSelect: the global weights only.
        eval_from_view: ``(view, client, client_state, cfg, env, split) -> Metrics`` when the view is
            not a state ``evaluate`` reads (pFedHN); None: ``evaluate`` itself.
        fit_unseen: optional ``fit_unseen(result, fed, cfg, env) -> StageResult``, what the algorithm does
            for the federation's unseen clients (``data.unseen_clients``) once training ends, before they
            count: pFedHN learns each one's embedding with the hypernetwork frozen (sec. 5.3). None: they
            are tested as training left them (FedL2P's meta-nets serve them as they are, sec. 4.3).
        silent_update: under ``participation="broadcast"``, what a client that got the broadcast but does not
            report does: ``silent_update(msg, client, client_state, cfg, env) -> (Update, client_state)``,
            its payload not sent (FedPer: the whole update, keeping its new head; pFedVEM: the E-step on its
            posterior, no base training). None: nothing, its client state unchanged (FedAvg and its variants:
            their local model would only feed the report). A variant that replaces ``client_update`` of an
            algorithm with a ``silent_update`` replaces that too.
    """

    name: str
    label: str
    config: type
    init: Callable
    broadcast: Callable
    client_update: Callable
    aggregate: Callable
    evaluate: Callable
    global_model: Callable = lambda state: None
    report: Callable | None = None
    needs_pretrained: bool = False
    exports_global: bool = False
    thread_unsafe: str = ""
    vectorizable: bool = False
    plain_sgd: Callable | None = None
    eval_view: Callable = lambda state, cid, cfg, env: state
    eval_from_view: Callable | None = None
    fit_unseen: Callable | None = None
    silent_update: Callable | None = None

    def start(self, model, fed, cfg, env: Env):
        """``init``'s server state; under ``participation="broadcast"`` (a dict state) with the client ids the
        reporters are drawn from (`pflkit.fl.sampling.roster`)."""
        state = self.init(model, fed, cfg, env)
        return {**state, **roster(fed, cfg)} if broadcasting(cfg) else state

    def send(self, state, client_id: int, cfg, env: Env):
        """What travels to ``client_id``: ``broadcast``'s message, flagged with whether it reports under
        ``participation="broadcast"`` (`pflkit.fl.sampling.flag`)."""
        return flag(self.broadcast(state, client_id, cfg, env), state, client_id, cfg, env)

    def respond(self, msg, client, client_state, cfg, env: Env) -> tuple[Update, Any]:
        """A client's answer to what `send` sent: ``client_update`` on the plain message; under
        ``participation="broadcast"`` a client that does not report runs ``silent_update`` (or nothing) and
        sends no payload, and the metrics say ``reported`` (0 / 1: the loop logs the round's share)."""
        if not broadcasting(cfg):
            return self.client_update(msg, client, client_state, cfg, env)
        msg, report = unflag(msg, cfg)
        if report:
            upd, client_state = self.client_update(msg, client, client_state, cfg, env)
        elif self.silent_update is not None:
            upd, client_state = self.silent_update(msg, client, client_state, cfg, env)
            upd = dataclasses.replace(upd, payload=None)
        else:
            upd = Update(client.id, 0, None)
        return dataclasses.replace(upd, metrics={**upd.metrics, "reported": float(report)}), client_state

    def evaluate_view(self, view, client, client_state, cfg, env, split) -> Metrics:
        """The client's metrics on ``split`` from ``eval_view``'s view of the server state."""
        return (self.eval_from_view or self.evaluate)(view, client, client_state, cfg, env, split)

    def make_config(self, values: dict | None = None, prefix: str = ""):
        from pflkit.config import from_dict

        return from_dict(self.config, values or {}, prefix)


def check_config(algo: Algorithm, cfg) -> None:
    if not isinstance(cfg, algo.config):
        raise ConfigError(f"{algo.name}: expected a {algo.config.__name__}, got {type(cfg).__name__}")


def replace(algo: Algorithm, **changes) -> Algorithm:
    """A variant of ``algo`` with some phases or metadata replaced."""
    return dataclasses.replace(algo, **changes)
