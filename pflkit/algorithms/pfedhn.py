"""pFedHN and pFedHN-PC: personalized federated hypernetworks (Shamsian et al., ICML 2021).

The server holds a hypernetwork h(v; phi) (`pflkit.algorithms.hypernet`) and one
embedding v_i per client. A round of Alg. 1:

1. ``broadcast``: theta_i = h(v_i; phi), only the target network's tensors travel;
2. ``client_update``: K local SGD steps from theta_i (K = 50, each on a fresh random
   batch) give theta_tilde_i; the client returns delta theta_i = theta_tilde_i - theta_i;
3. ``aggregate``: phi and v_i descend the surrogate 1/2 ||theta_tilde_i - h(v_i; phi)||^2
   (sec. 3.2), a vector-Jacobian product through h, then a server optimizer step
   (SGD, lr 1e-2, momentum 0.9, weight decay 1e-3; the hypernetwork gradient clipped
   at norm 50, as in the authors' code).

The paper samples one client per step: keep ``fraction`` small so that the loop
draws one client per round (``round(fraction * n) <= 1``). With several clients per
round, ``multi_client="mean"`` averages their surrogate gradients for phi (each v_i
gets its own full gradient) and ``"series"`` applies them one after another, each
at the hypernetwork the previous one left. The exact "visit the sampled clients in
series" protocol of pFedVEM's footnote (each client receives weights from the
already updated phi) is one client per round with ``rounds`` multiplied.

Variants (config fields, not separate code paths):

* pFedHN-PC (sec. 3.3, ``personal_classifier=True``; registered as ``pfedhn_pc``):
  h emits every tensor except ``model.head``; each client keeps its head as client
  state, trained in the same local steps, and never sends it.
* Computational budgets (sec. 5.2, ``budget_widths=(8, 16, 32)``): one hypernetwork
  with heads for the tensors of all widths of ``budget_model``; the clients are
  split into equal contiguous groups and each receives the network of its width.
* Fixed embeddings (App. C.5, ``embeddings="class_proportions"``): v_i is the
  client's share of every class, p_hat_i, and is not trained.
* Novel clients (sec. 5.3): `fit_novel_clients` freezes phi and optimizes each new
  client's embedding on that client's data until it stops moving (``novel_fit="converge"``,
  the paper's "optimize v_new"), with Alg. 1's update restricted to v_new and the authors'
  embedding optimizer; ``novel_fit="rounds"`` is the older fixed budget of Alg. 1 rounds
  over the novel clients (`novel_client_algorithm` with `run_rounds`).

Buffers (BatchNorm statistics) are not generated: they start from the initial
model and stay on the client. Accuracy is the mean over clients of each client's
accuracy (the paper's definition; the authors' code pools predictions).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pflkit.algorithms import hypernet as hn
from pflkit.config import OMIT_DEFAULT, non_negative, one_of, positive, require
from pflkit.fl.algorithm import Algorithm, FLConfig, Update, replace
from pflkit.fl.federate import contiguous_group
from pflkit.fl.federation import Federation
from pflkit.fl.loop import StageResult, run_rounds
from pflkit.fl.train import evaluate_model, round_sgd
from pflkit.fl.transport import evaluate_clients
from pflkit.io import progress_bar
from pflkit.models.introspect import head_param_names


@dataclass(frozen=True)
class PFedHNConfig(FLConfig):
    """Hyperparameters of pFedHN; defaults are the paper's / authors' code.

    Attributes:
        rounds: server steps (5,000 in the paper). fraction: keep it small for one client per step.
        local_steps: K inner SGD steps (50); lr / momentum / weight_decay / batch_size /
            max_grad_norm: the inner optimizer (5e-3, 0.9, 5e-5, 64, 50).
        server_optimizer, server_lr, server_momentum, server_weight_decay: the hypernetwork's
            optimizer ("sgd", 1e-2, 0.9, 1e-3). embed_lr: the embeddings' rate (0: server_lr).
        server_max_grad_norm: clip of the hypernetwork gradient (50; 0 = none).
        embed_dim: embedding size (0: floor(1 + n / 4), App. C.2.2).
        embed_std: the trainable embeddings start N(0, embed_std^2) (1: the authors' nn.Embedding).
            A small value starts every client from the same model, so the embeddings' positions
            are learned rather than inherited from the random draw (used for Fig. 4 at short budgets).
        hidden, depth: trunk width (100) and hidden-to-hidden layers (3).
        spectral_norm: App. C.3.
        embeddings: "learned" or "class_proportions" (fixed, App. C.5).
        personal_classifier: pFedHN-PC (sec. 3.3).
        budget_widths: target widths of the computational-budget setup (sec. 5.2); () = off.
        budget_model, budget_option: the model built per width (``lenet``, option ``width``).
        multi_client: "mean" or "series" (module docstring).
        train_hypernet: False freezes phi (novel clients, sec. 5.3).
        novel_fit: how `fit_novel_clients` learns a novel client's embedding (sec. 5.3):
            "converge" (each client on its own data until the embedding stops moving, at most
            ``novel_max_steps`` updates; stop rule in `hypernet.fit_embedding`, tolerance
            ``novel_tol`` over windows of ``novel_window`` updates) or "rounds" (the older
            budget: ``novel_rounds`` Alg. 1 rounds over the novel clients, one random client a
            round; 0: 10 per novel client). The embedding's optimizer is the authors' one for
            embeddings: SGD at embed_lr (or server_lr), server_momentum, server_weight_decay,
            gradient clipped at server_max_grad_norm.
        checkpoint_every: 20 server steps (one step is one client visit of ~1 s on a CPU, while the
            hypernetwork and its momentum are ~200 MB for a LeNet target).
        report_embeddings, report_mix_and_match: what the stage's report keeps for the figures that need
            more than accuracies (`pfedhn_report`): the client embeddings (Fig. 4's t-SNE) and, for
            pFedHN-PC, the mix-and-match accuracy matrix (Fig. 3; n^2 evaluations). Both off: no report.
    """

    rounds: int = 5000
    fraction: float = 1e-6
    eval_every: int = 30
    batch_size: int = 64
    lr: float = 5e-3
    momentum: float = 0.9
    weight_decay: float = 5e-5
    local_steps: int = 50
    max_grad_norm: float = 50.0
    server_optimizer: str = "sgd"
    server_lr: float = 1e-2
    server_momentum: float = 0.9
    server_weight_decay: float = 1e-3
    server_max_grad_norm: float = 50.0
    embed_lr: float = 0.0
    embed_dim: int = 0
    embed_std: float = 1.0
    hidden: int = 100
    depth: int = 3
    spectral_norm: bool = False
    embeddings: str = "learned"
    personal_classifier: bool = False
    budget_widths: tuple[int, ...] = ()
    budget_model: str = "lenet"
    budget_option: str = "width"
    multi_client: str = "mean"
    train_hypernet: bool = True
    novel_fit: str = "converge"
    novel_max_steps: int = 1000
    novel_tol: float = 1e-3
    novel_window: int = 20
    novel_rounds: int = 0
    checkpoint_every: int = 20
    # what the stage's report keeps for the figures (`pfedhn_report`); off: no report, as before
    report_embeddings: bool = field(default=False, metadata=OMIT_DEFAULT)
    report_mix_and_match: bool = field(default=False, metadata=OMIT_DEFAULT)

    def __post_init__(self):
        super().__post_init__()
        require(self.local_steps >= 1, "local_steps", self.local_steps, "pFedHN needs K >= 1 local steps")
        require(self.personal_classifier or not self.report_mix_and_match, "report_mix_and_match",
                self.report_mix_and_match, "mix and match needs pFedHN-PC's personal heads (personal_classifier)")
        one_of("server_optimizer", self.server_optimizer, {"sgd", "adam"})
        positive("server_lr", self.server_lr)
        non_negative("server_momentum", self.server_momentum)
        non_negative("server_weight_decay", self.server_weight_decay)
        non_negative("server_max_grad_norm", self.server_max_grad_norm)
        non_negative("embed_lr", self.embed_lr)
        require(self.embed_dim >= 0, "embed_dim", self.embed_dim, "must be >= 0 (0: 1 + n/4)")
        positive("embed_std", self.embed_std)
        require(self.hidden >= 1, "hidden", self.hidden, "must be >= 1")
        require(self.depth >= 0, "depth", self.depth, "must be >= 0")
        one_of("embeddings", self.embeddings, {"learned", "class_proportions"})
        one_of("multi_client", self.multi_client, {"mean", "series"})
        one_of("novel_fit", self.novel_fit, {"converge", "rounds"})
        require(self.novel_max_steps >= 1, "novel_max_steps", self.novel_max_steps, "must be >= 1")
        non_negative("novel_tol", self.novel_tol)
        require(self.novel_window >= 1, "novel_window", self.novel_window, "must be >= 1")
        require(self.novel_rounds >= 0, "novel_rounds", self.novel_rounds, "must be >= 0 (0: 10 per novel client)")
        # the default tiny fraction means "one client per step"; Bernoulli draws would almost never pick one
        require(self.sampling == "fraction" or self.fraction >= 1e-3, "fraction", self.fraction,
                "with sampling='bernoulli' use the share of clients per round (>= 1e-3)")
        require(all(isinstance(w, int) and w >= 1 for w in self.budget_widths), "budget_widths",
                self.budget_widths, "must be positive integers")
        require(len(set(self.budget_widths)) == len(self.budget_widths), "budget_widths", self.budget_widths,
                "must be distinct")


@dataclass(frozen=True)
class PFedHNPCConfig(PFedHNConfig):
    """pFedHN-PC: the authors' code uses a larger server rate (5e-2) for it."""

    personal_classifier: bool = True
    server_lr: float = 5e-2


# ---------------------------------------------------------------- target networks


def budget_group(client_id: int, num_clients: int, num_groups: int) -> int:
    """Table 2's budget group of a client: equal contiguous groups, clients [0, n/G) are group 0 (S), and so on."""
    return contiguous_group(client_id, num_clients, num_groups)


def _budget_model(cfg, width: int, meta):
    from pflkit.models import build_model

    return build_model(cfg.budget_model, num_classes=meta.num_classes, input_shape=tuple(meta.input_shape),
                       **{cfg.budget_option: width})


def _generated_names(model, cfg) -> list[str]:
    """Parameters h emits: all of them, or all but the head for pFedHN-PC."""
    skip = set(head_param_names(model)) if cfg.personal_classifier else set()
    return [n for n, _ in model.named_parameters() if n not in skip]


def _prefix(width: int | None) -> str:
    return "" if width is None else f"w{width}/"


def _targets(model, fed, cfg) -> dict[str, tuple]:
    if not cfg.budget_widths:
        shapes = dict(model.named_parameters())
        return {n: tuple(shapes[n].shape) for n in _generated_names(model, cfg)}
    out = {}
    for w in cfg.budget_widths:
        m = _budget_model(cfg, w, fed.meta)
        shapes = dict(m.named_parameters())
        out.update({_prefix(w) + n: tuple(shapes[n].shape) for n in _generated_names(m, cfg)})
    return out


def class_proportions(fed) -> torch.Tensor:
    """p_hat: each client's share of every class's training samples (sec. 5.3, App. C.5)."""
    h = fed.histograms("train").astype(np.float64)
    total = h.sum(axis=0, keepdims=True)
    return torch.as_tensor(np.divide(h, total, out=np.zeros_like(h), where=total > 0), dtype=torch.float32)


# ---------------------------------------------------------------- phases


def init(model, fed, cfg, env) -> dict:
    """Server state: the hypernetwork (spec + tensors), its optimizer state, the embedding row of each client."""
    targets = _targets(model, fed, cfg)
    fixed = class_proportions(fed) if cfg.embeddings == "class_proportions" else None
    dim = fixed.shape[1] if fixed is not None else (cfg.embed_dim or hn.default_embed_dim(len(fed.seen_ids)))
    spec = hn.spec_of(fed.num_clients, targets, embed_dim=dim, hidden=cfg.hidden, depth=cfg.depth,
                      spectral_norm=cfg.spectral_norm, fixed=fixed is not None, embed_std=cfg.embed_std)
    env.seed_torch("pfedhn-init")
    net = hn.build(spec, fixed).to(env.device)
    return {"spec": spec, "hnet": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "opt": {}, "rows": list(range(fed.num_clients))}


def _width(state, client_id, cfg) -> int | None:
    if not cfg.budget_widths:
        return None
    n = len(state["rows"])
    return cfg.budget_widths[budget_group(client_id, n, len(cfg.budget_widths))]


def _names(state, client_id: int, cfg) -> tuple[str, list[str]]:
    """The budget prefix of the client's width and the names h emits for it."""
    pre = _prefix(_width(state, client_id, cfg))
    return pre, [n for n in state["spec"]["targets"] if n.startswith(pre) and (pre or "/" not in n)]


@torch.no_grad()
def generate(state, client_id: int, cfg) -> dict[str, torch.Tensor]:
    """theta_i = h(v_i; phi) with the target's own parameter names (the budget prefix removed)."""
    net = hn.materialize(state["spec"], state["hnet"])
    pre, names = _names(state, client_id, cfg)
    out = net(state["rows"][client_id], names)
    return {n[len(pre):]: t.detach().clone() for n, t in out.items()}


def broadcast(state, client_id, cfg, env):
    """Only theta_i travels (plus the client's budget width, a plain int)."""
    return {"theta": generate(state, client_id, cfg), "width": _width(state, client_id, cfg)}


def _initial_model(width, client, cfg, env):
    """The run's initial target model, rebuilt on the client from the run seed (nothing travels)."""
    with env.torch_rng("init"):  # this thread's seeded draws, also in the threads engine
        return env.model_fn() if width is None else _budget_model(cfg, width, client.meta)


def _scratch(width, client, cfg, env, theta):
    """A cached target module of this width, and the initial values of its local part."""
    key = ("pfedhn", width, tuple(sorted(theta)))
    def build():
        model = _initial_model(width, client, cfg, env).to(env.device)
        return model, _local_part(model, theta)

    return env.cached(key, build)  # Env's per-run module cache (the same one `scratch_model` uses)


def client_model(theta, width, client, client_state, cfg, env):
    """Target network = generated theta + the client's own head (PC) and buffers (also the Flower adapter's)."""
    model, initial_local = _scratch(width, client, cfg, env, theta)
    local = client_state if client_state is not None else initial_local
    model.load_state_dict({**local, **theta}, strict=True)
    return model


def _local_part(model, theta) -> dict:
    """What the client keeps: every state entry h does not emit (head for PC, BN buffers)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k not in theta}


def client_update(msg, client, client_state, cfg, env):
    """K local SGD steps from theta_i; returns delta theta (Alg. 1 lines 5-8)."""
    theta = msg["theta"]
    model = client_model(theta, msg["width"], client, client_state, cfg, env)
    stats = round_sgd(model, client, cfg, env, where=f"pFedHN client {client.id}")  # K = local_steps >= 1
    new = model.state_dict()
    delta = {k: (new[k] - theta[k]).detach().clone() for k in theta}
    keep = _local_part(model, theta)
    return Update(client.id, client.num("train"), {"delta": delta}, {"loss": stats["loss"]}), (keep or None)


def _rates(state, cfg) -> dict[str, float]:
    emb = cfg.embed_lr or cfg.server_lr
    return {n: (emb if n == "embeddings" else cfg.server_lr) for n in state["hnet"]}


def _step(state, net, rows, deltas, weights, cfg) -> dict:
    grads = hn.surrogate_grads(net, rows, deltas, weights)
    if not cfg.train_hypernet:
        grads = {k: g for k, g in grads.items() if k == "embeddings"}
    if len(rows) > 1 and "embeddings" in grads:
        # phi takes the mean over clients; each v_i its own full step (v_i appears in one term only)
        grads["embeddings"] = grads["embeddings"] * len(rows)
    grads = hn.clip_grad_norm(grads, cfg.server_max_grad_norm)  # over all of h, embeddings included
    params = {n: p for n, p in net.named_parameters()}
    new, opt = hn.server_step({k: p.detach() for k, p in params.items()}, grads, state["opt"],
                              kind=cfg.server_optimizer, lr=_rates(state, cfg), momentum=cfg.server_momentum,
                              weight_decay=cfg.server_weight_decay)
    if not cfg.train_hypernet and "embeddings" in new:
        # novel clients: only their own rows move (no decay / momentum on the trained clients' rows)
        frozen = torch.ones(len(new["embeddings"]), dtype=torch.bool)
        frozen[torch.as_tensor(state["rows"])] = False
        new["embeddings"][frozen] = state["hnet"]["embeddings"][frozen]
    tensors = {**{k: v for k, v in state["hnet"].items() if k not in new}, **new}
    return {**state, "hnet": tensors, "opt": opt}


def _prefixed(delta, width) -> dict:
    return {_prefix(width) + k: v for k, v in delta.items()}


def aggregate(state, updates, cfg, env):
    """phi, v <- descend 1/2 ||theta_tilde - h(v; phi)||^2 (Alg. 1 lines 9-10)."""
    if not updates:
        return state
    rows = [state["rows"][u.client_id] for u in updates]
    deltas = [_prefixed(u.payload["delta"], _width(state, u.client_id, cfg)) for u in updates]
    if cfg.multi_client == "mean" or len(updates) == 1:
        net = hn.materialize(state["spec"], _copy(state["hnet"]))
        state = _step(state, net, rows, deltas, [1.0 / len(rows)] * len(rows), cfg)
    else:
        for row, delta in zip(rows, deltas):
            net = hn.materialize(state["spec"], _copy(state["hnet"]))
            state = _step(state, net, [row], [delta], [1.0], cfg)
    if state["spec"]["spectral_norm"]:
        net = hn.materialize(state["spec"], _copy(state["hnet"]))
        hn.refresh_spectral_norm(net)
        state = {**state, "hnet": {k: v.detach() for k, v in net.state_dict().items()}}
    return state


def _copy(tensors: dict) -> dict:
    return {k: v.detach().clone() for k, v in tensors.items()}


def personal_model(state, client, client_state, cfg, env, *, theta_from: int | None = None):
    """Client ``client``'s personalized network: h's weights for it + its own head / buffers.

    ``theta_from`` takes the generated part from another client (pFedHN Fig. 3's
    mix-and-match: client i's head on client j's feature extractor).
    """
    source = client.id if theta_from is None else theta_from
    theta = generate(state, source, cfg)
    return client_model(theta, _width(state, client.id, cfg), client, client_state, cfg, env)


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(personal_model(state, client, client_state, cfg, env), client, split, device=env.device)


def embeddings(state) -> torch.Tensor:
    """The client embeddings v_1..v_n (rows in client order), for Fig. 4's t-SNE."""
    return state["hnet"]["embeddings"][torch.as_tensor(state["rows"])].detach().clone()


def novel_client_algorithm(trained_state: dict, num_novel: int, *, init: str = "mean",
                           label: str = "pFedHN (novel)", seed: int = 0) -> Algorithm:
    """pFedHN for novel clients (sec. 5.3): phi frozen, only new embeddings are learned.

    Returns a variant whose ``init`` starts from ``trained_state`` with ``num_novel``
    new embedding rows (client ``j`` of the novel federation uses row ``n + j``),
    initialized at the mean of the trained embeddings (``init="mean"``) or N(0, 1)
    (``"random"``). Train it with ``dataclasses.replace(cfg, train_hypernet=False)``.
    """
    one_of("init", init, {"mean", "random"})
    require(num_novel >= 1, "num_novel", num_novel, "must be >= 1")
    if trained_state["spec"]["fixed"]:
        raise ValueError("fixed (class-proportion) embeddings need no training for novel clients")

    def novel_init(model, fed, cfg, env):
        require(fed.num_clients == num_novel, "num_novel", num_novel,
                f"the novel federation has {fed.num_clients} clients")
        require(not cfg.train_hypernet, "train_hypernet", cfg.train_hypernet, "must be False for novel clients")
        state = copy.deepcopy(trained_state)
        old = state["hnet"]["embeddings"]
        gen = torch.Generator().manual_seed(seed)
        new = (old.mean(0, keepdim=True).repeat(num_novel, 1) if init == "mean"
               else torch.randn(num_novel, old.shape[1], generator=gen).to(old))
        state["hnet"]["embeddings"] = torch.cat([old, new])
        state["spec"] = {**state["spec"], "num_clients": old.shape[0] + num_novel}
        state["rows"] = list(range(old.shape[0], old.shape[0] + num_novel))
        state["opt"] = {}
        return state

    return replace(PFEDHN, name="pfedhn_novel", label=label, init=novel_init)


def fit_novel_embedding(state, client, client_state, cfg, env) -> tuple[dict, Any, dict]:
    """Sec. 5.3 for one novel client: phi frozen, v_new optimized on this client's data.

    Every update is Alg. 1's round restricted to v_new: the client runs K local steps from
    theta = h(v_new; phi) and returns delta theta; v_new descends the surrogate
    1/2 ||theta_tilde - h(v_new; phi)||^2 with the authors' embedding optimizer (SGD at
    ``embed_lr or server_lr``, ``server_momentum``, ``server_weight_decay`` (their optimizer
    decays the embeddings too), the gradient clipped at ``server_max_grad_norm``), until
    `hypernet.fit_embedding`'s stop rule (``novel_tol``, ``novel_window``) or
    ``novel_max_steps`` updates. The client's batches come from (seed, client, update).

    Returns:
        The state with the client's row replaced, its client state (pFedHN-PC's head, BN
        buffers) and ``{"client", "steps", "converged", "drift"}``.
    """
    row = state["rows"][client.id]
    width = _width(state, client.id, cfg)
    pre, names = _names(state, client.id, cfg)
    net = hn.materialize(state["spec"], state["hnet"])
    local = {"state": client_state}

    def answer(theta, step):
        now = env.at_round(step)
        now.seed_torch("client", client.id, step)
        msg = {"theta": {n[len(pre):]: t for n, t in theta.items()}, "width": width}
        upd, local["state"] = client_update(msg, client, local["state"], cfg, now)
        return _prefixed(upd.payload["delta"], width)

    v, info = hn.fit_embedding(net, state["hnet"]["embeddings"][row], names, answer,
                               lr=cfg.embed_lr or cfg.server_lr, momentum=cfg.server_momentum,
                               weight_decay=cfg.server_weight_decay, max_grad_norm=cfg.server_max_grad_norm,
                               max_steps=cfg.novel_max_steps, tol=cfg.novel_tol, window=cfg.novel_window)
    emb = state["hnet"]["embeddings"].clone()
    emb[row] = v.to(emb)
    return {**state, "hnet": {**state["hnet"], "embeddings": emb}}, local["state"], {"client": client.id, **info}


def fit_novel_clients(trained_state: dict, novel, cfg, env, *, init: str = "mean", seed: int = 0,
                      desc: str | None = None):
    """Sec. 5.3: freeze phi, learn one embedding per novel client, then test every novel client.

    ``cfg.novel_fit == "converge"`` (default): `fit_novel_embedding` on each client in turn
    (phi is frozen, so the clients do not interact); the history has one row per client
    with its number of updates and whether the stop rule fired. ``"rounds"``: the older
    budget, ``novel_rounds`` Alg. 1 rounds of `novel_client_algorithm` in `run_rounds`.
    The new embeddings start at the mean of the trained ones (``init="mean"``) or N(0, 1).

    Returns:
        A `pflkit.fl.loop.StageResult` over the novel federation.
    """
    algo = novel_client_algorithm(trained_state, novel.num_clients, init=init, seed=seed)
    ncfg = dataclasses.replace(cfg, train_hypernet=False)
    if cfg.novel_fit == "rounds":
        ncfg = dataclasses.replace(ncfg, rounds=cfg.novel_rounds or 10 * novel.num_clients)
        env.seed_torch("init")
        return run_rounds(algo, ncfg, novel, env.model_fn().to(env.device), env, desc=desc)
    t0 = time.perf_counter()
    state, client_states, history = algo.init(None, novel, ncfg, env), {}, []
    for client in progress_bar(novel.clients, desc=desc, disable=desc is None or None):
        state, client_states[client.id], info = fit_novel_embedding(state, client, None, ncfg, env)
        history.append(info)
    result = StageResult("ok", state, client_states, history)
    result.set_test(evaluate_clients(algo, state, client_states, novel, range(novel.num_clients), ncfg, env,
                                     "test").per_client)
    result.seconds = time.perf_counter() - t0
    return result


def fit_unseen(result: StageResult, fed: Federation, cfg, env) -> StageResult:
    """Sec. 5.3 for the federation's unseen clients (``data.unseen_clients``; Fig. 2 takes the last ten, with
    ``data.unseen_pick = "last"``), once training on the others has ended: phi stays as training left it,
    each unseen client's embedding starts at the mean of the trained clients' and is learned on that
    client's data alone (`fit_novel_embedding`; phi frozen, so the clients do not interact), then the
    client is tested. Their embedding rows, client states and test metrics replace the untrained ones, so
    the stage's unseen accuracy is the novel clients' (Fig. 2's acc_novel); each fit's
    ``{"client", "steps", "converged", "drift"}`` goes to ``state["novel_fit"]`` for `pfedhn_report`.
    Fixed (class-proportion) embeddings have nothing to learn (App. C.5): the result is returned as it is.
    """
    state = result.state
    if state["spec"]["fixed"]:
        return result
    emb = state["hnet"]["embeddings"].clone()
    unseen = torch.as_tensor([state["rows"][c] for c in fed.unseen_ids])
    emb[unseen] = emb[torch.as_tensor([state["rows"][c] for c in fed.seen_ids])].mean(0, keepdim=True)
    state = {**state, "hnet": {**state["hnet"], "embeddings": emb}}
    ncfg = dataclasses.replace(cfg, train_hypernet=False)
    client_states, fits, t0 = dict(result.client_states), [], time.perf_counter()
    for cid in fed.unseen_ids:
        state, client_states[cid], info = fit_novel_embedding(state, fed.clients[cid], client_states.get(cid),
                                                              ncfg, env)
        fits.append({**info, "drift": info["drift"] if np.isfinite(info["drift"]) else None})
    tested = evaluate_clients(PFEDHN, state, client_states, fed, fed.unseen_ids, ncfg, env, "test").per_client
    out = dataclasses.replace(result, state={**state, "novel_fit": fits}, client_states=client_states)
    out.set_test({**result.per_client, **tested})
    out.seconds = result.seconds + time.perf_counter() - t0
    return out


def evaluate_generated(view, client, client_state, cfg, env, split):
    """A client's evaluation from its generated weights alone (`broadcast`'s message: h stays on the
    server); the target network `personal_model` builds."""
    model = client_model(view["theta"], view["width"], client, client_state, cfg, env)
    return evaluate_model(model, client, split, device=env.device)


def pfedhn_report(state, fed: Federation, cfg, env, client_states) -> dict | None:
    """The arrays Fig. 3 and Fig. 4 draw, per client in client order, when the config asks for them (None
    otherwise: no report file, so a stage that asks for nothing leaves what it always left).

    ``embedding``: each client's v_i (`embeddings`), 5 significant digits; ``mix_and_match``: row i is
    client i's test accuracy with client j's generated extractor and its own head (`mix_and_match`, in %);
    ``classes``: the classes of each client's train split, with ``class_names`` when there are at most 100;
    ``groups`` / ``group_names``: each client's value of a grouping key of the data (Omniglot's alphabet) and
    the names of those values (the figures' labels and colours in results mode). With unseen clients (Fig. 2,
    `fit_unseen`), always: ``novel``, their ids, how each embedding's fit ended (``steps``, ``converged``,
    ``drift``) and every client's train class histogram, from which the TV to the nearest training client
    is computed (`pflkit.analysis.pfedhn.tv_to_nearest`, either basis).
    """
    out: dict = {}
    if fed.unseen_ids and "novel_fit" in state:
        fits = state["novel_fit"]
        out["novel"] = {"clients": list(fed.unseen_ids), **{k: [f[k] for f in fits] for k in ("steps", "converged")},
                        "drift": [None if f["drift"] is None else float(f"{f['drift']:.5g}") for f in fits],
                        "train_histograms": fed.histograms("train").astype(int).tolist()}
    if cfg.report_embeddings or cfg.report_mix_and_match:
        out["classes"] = [[int(c) for c in np.flatnonzero(h)] for h in fed.histograms("train")]
        if len(fed.meta.class_names) <= 100:
            out["class_names"] = list(fed.meta.class_names)
        keys = [k for k in fed.meta.group_names if all(k in c.info for c in fed.clients)]
        if keys:
            out["groups"] = {k: [fed.clients[i].info[k] for i in range(fed.num_clients)] for k in keys}
            out["group_names"] = {k: list(fed.meta.group_names[k]) for k in keys}
    if cfg.report_embeddings:
        out["embedding"] = [[float(f"{x:.5g}") for x in row] for row in embeddings(state).tolist()]
    if cfg.report_mix_and_match:
        acc = mix_and_match(state, client_states or {}, fed, cfg, env)
        out["mix_and_match"] = [[round(100.0 * a, 4) for a in row] for row in acc.tolist()]
    return out or None


PFEDHN = Algorithm(
    name="pfedhn", label="pFedHN", config=PFedHNConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate,
    eval_view=broadcast, eval_from_view=evaluate_generated, vectorizable=True, report=pfedhn_report,
    fit_unseen=fit_unseen,
)

PFEDHN_PC = replace(PFEDHN, name="pfedhn_pc", label="pFedHN-PC", config=PFedHNPCConfig)


def mix_and_match(state, client_states: dict, fed: Federation, cfg, env, split: str = "test") -> np.ndarray:
    """acc[i, j]: client i's data, client j's generated feature extractor, client i's own head.

    For a pFedHN-PC state (sec. 5.4). The diagonal is each client's own model.
    """
    n = fed.num_clients
    acc = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            model = personal_model(state, fed.clients[i], client_states.get(i), cfg, env, theta_from=j)
            acc[i, j] = evaluate_model(model, fed.clients[i], split, device=env.device)["acc"]
    return acc


__all__ = ["PFEDHN", "PFEDHN_PC", "PFedHNConfig", "PFedHNPCConfig", "budget_group", "class_proportions",
           "client_model", "embeddings", "fit_novel_clients", "fit_novel_embedding", "fit_unseen", "generate", "mix_and_match",
           "novel_client_algorithm", "personal_model", "pfedhn_report"]
