"""FedL2P: Federated Learning to Personalize (Lee et al., NeurIPS 2023), with its variants.

Given a pretrained global model theta_g, the federation learns the meta-parameters
lambda = {w_bn, w_lr, eta_tilde} of two meta-nets that map a client's data statistics to
its personalization hyperparameters: BNNet gives beta, the per-BN-layer weight of the
client's statistics against the pretrained ones (Eq. 2), LRNet times eta_tilde gives eta,
one fine-tuning learning rate per weight / bias tensor (Eq. 4). Alg. 1:

* ``init`` (line 1): lambda at its App. D/E initial values; theta_g is kept, never trained;
* ``broadcast`` (line 5): theta_g and lambda;
* ``client_update`` (lines 6-12): client statistics, then one meta step per validation
  batch of ``meta_iters`` passes over the validation split (fine-tune theta_g for e epochs
  with the current beta and eta; one clipped hypergradient SGD step on lambda); reports
  lambda_i, N_i and the mean validation loss L_V;
* ``aggregate`` (line 14): lambda = sum_i N_i lambda_i / sum_i N_i;
* the loop keeps the lambda with the lowest mean validation loss over rounds
  (``select="update_val_loss"``, sec. 4.1);
* ``evaluate``: each client fine-tunes theta_g on its train split with its own beta and eta
  and is tested on its split (sec. 3.2, end).

Variants (Tables 2-5, 8), each a config subclass with different defaults:

* ``L2P``: lambda learned locally by every client with the same compute (the same
  sampling schedule, K iterations whenever sampled), no FL: lambda_i lives in the client
  state, the server never averages;
* ``FEDL2P_FOMAML``: FOMAML+ meta-gradients instead of the IFT (App. F, Table 8);
* ``FEDL2P_BNNET``: BNNet only, eta = lr for every tensor (Table 5);
* ``FEDL2P_LRNET_BETA1`` / ``FEDL2P_LRNET_BETA0``: LRNet only with beta fixed to 1 / 0.

One client's side (meta-learning lambda, personalizing) is `pflkit.algorithms.fedl2p_client`.
The readings we chose where the paper is ambiguous are written in `pflkit.meta.objectives`
(where the IFT is applied, L_T), `pflkit.algorithms.fedl2p_client` (the meta schedule, the
client statistics), `pflkit.meta.functional` (how beta's gradient flows),
`pflkit.meta.metanets` (one eta per tensor) and `pflkit.meta.linear_solve` (Alg. 2's missing
factor psi: ``neumann_scaled=False`` follows the paper and the authors' code).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pflkit.algorithms.fedl2p_client import (
    META_SCHEDULES, hyperparams, meta_learn, model_spec, personalize, prepare_client, sparsity, summary,
)
from pflkit.config import non_negative, one_of, positive, require
from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.algorithm import Algorithm, FLConfig, Update, replace
from pflkit.fl.train import evaluate_model, get_state
from pflkit.meta.metanets import init_meta_params
from pflkit.meta.objectives import LT_MODES
from pflkit.models.introspect import bn_modules
from pflkit.models.mixed_bn import CLIENT_STATS_INIT

__all__ = ["FedL2PConfig", "FOMAMLConfig", "BNNetOnlyConfig", "LRNetBeta1Config", "LRNetBeta0Config",
           "FEDL2P", "L2P", "FEDL2P_FOMAML", "FEDL2P_BNNET", "FEDL2P_LRNET_BETA1", "FEDL2P_LRNET_BETA0",
           "VARIANTS", "hyperparameter_report"]


@dataclass(frozen=True)
class FedL2PConfig(FLConfig):
    """FedL2P's settings; defaults are the paper's (sec. 4.1, App. D/E).

    Attributes:
        rounds, fraction: T = 500 rounds, r = 0.1 of the clients per round.
        select: ``"update_val_loss"``: keep the lambda of the round with the lowest mean
            validation loss of its clients (sec. 4.1), weighted by their sample counts;
            ``"update_val_loss_mean"``: unweighted, as the authors' code (`pflkit.fl.loop._score`). ``eval_every`` defaults to 0 since
            that selection needs no validation pass.
        batch_size: 32.
        lr: the fine-tuning learning rate (1e-3 on CIFAR-10); eta_tilde's initial value
            and eta of every tensor when LRNet is off.
        epochs: e, fine-tuning epochs per meta step and for personalization (5 or 15).
        meta_iters: passes over the client's validation split per round (the authors' 3
            outer epochs); with ``meta_schedule="steps"``, K, the number of meta steps.
        meta_schedule: ``"passes"`` (default, the authors' code): one meta step per
            validation batch of ``val_batch_size``, ``meta_iters * ceil(|V| / val_batch_size)``
            steps; ``"steps"``: exactly ``meta_iters`` steps (pflkit's earlier schedule).
        val_batch_size: L_V's batch: 32 (sec. 4.1's batch size, the authors' code); 0 uses
            the whole validation split (one step per pass, or per step with ``"steps"``).
            Under ``"steps"`` a size > 0 draws one random batch per step. The earlier
            pflkit default is ``meta_schedule="steps"`` with ``val_batch_size=0``.
        lt_mode: the training loss L_T of Eq. 9-10 (`pflkit.meta.objectives`):
            ``"last_step"`` (default, the authors' code): through the last fine-tuning
            step, cross-entropy in evaluation mode on one fresh training batch;
            ``"lookahead"``: an extra step on a fresh step batch, training mode.
        client_stats_init: where the client's BN running statistics start before each
            fine-tuning: ``"reset"`` (default, mean 0 / variance 1, the authors' code) or
            ``"pass"`` (one pass over the train split; `pflkit.models.mixed_bn`).
        meta_grad: ``"ift"`` (Alg. 2) or ``"fomaml"`` (FOMAML+, App. F).
        neumann_steps, psi: Q = 3 and psi = 0.1 of Alg. 2.
        neumann_scaled: multiply the Neumann sum by psi (the consistent approximation of
            H^{-1}); False (default) outputs Alg. 2's p as printed, as the authors' code.
        second_order: differentiate through the look-ahead gradient of Eq. 10 (third-order
            autograd; ``lt_mode="lookahead"`` only); False treats it as a constant, as the
            authors' code.
        zeta: SGD learning rates of (w_bn, w_lr, eta_tilde): (1e-3, 1e-3, 1e-4).
        clip: hypergradients clipped by value to [-clip, clip] (1; 0 disables).
        use_bnnet, use_lrnet, fixed_beta: the ablations of Table 5 (beta = fixed_beta
            without BNNet; eta = lr without LRNet).
        hidden, init_gain, bn_bias_init, lr_bias_init, lr_max: App. E (100, 0.1, 0.5, 1.0, 1000).
        hidden_gain: Xavier gain of the meta-nets' two hidden layers; 0 (default) = ``init_gain``
            in every layer (App. E). Not the paper's otherwise: a larger one makes the outputs
            depend more on the client (`pflkit.meta.metanets`).
        skip_nonfinite: skip batches with a non-finite loss and meta steps with a non-finite
            hypergradient (the authors' code) instead of stopping the run as diverged.
        augment: apply the federation's training augmentation while fine-tuning.

    ``local_epochs`` / ``local_steps`` are unused (``epochs`` is e); FedL2P fine-tunes with
    plain SGD, so ``momentum``, ``weight_decay`` and ``max_grad_norm`` must stay 0.
    """

    rounds: int = 500
    fraction: float = 0.1
    eval_every: int = 0
    select: str = "update_val_loss"
    batch_size: int = 32
    lr: float = 1e-3
    epochs: int = 15
    meta_iters: int = 3
    meta_schedule: str = "passes"
    lt_mode: str = "last_step"
    client_stats_init: str = "reset"
    meta_grad: str = "ift"
    neumann_steps: int = 3
    psi: float = 0.1
    neumann_scaled: bool = False
    second_order: bool = False
    zeta: tuple[float, ...] = (1e-3, 1e-3, 1e-4)
    clip: float = 1.0
    use_bnnet: bool = True
    use_lrnet: bool = True
    fixed_beta: float = 1.0
    hidden: int = 100
    init_gain: float = 0.1
    bn_bias_init: float = 0.5
    lr_bias_init: float = 1.0
    lr_max: float = 1000.0
    hidden_gain: float = 0.0
    val_batch_size: int = 32
    skip_nonfinite: bool = False
    augment: bool = True

    def __post_init__(self):
        super().__post_init__()
        require(isinstance(self.epochs, int) and self.epochs >= 0, "epochs", self.epochs, "must be an integer >= 0")
        require(isinstance(self.meta_iters, int) and self.meta_iters >= 1, "meta_iters", self.meta_iters,
                "must be an integer >= 1")
        one_of("meta_grad", self.meta_grad, {"ift", "fomaml"})
        one_of("meta_schedule", self.meta_schedule, set(META_SCHEDULES))
        one_of("lt_mode", self.lt_mode, set(LT_MODES))
        one_of("client_stats_init", self.client_stats_init, set(CLIENT_STATS_INIT))
        require(not (self.second_order and self.lt_mode == "last_step"), "second_order", self.second_order,
                "needs lt_mode='lookahead' (the last fine-tuning step's gradient is a constant)")
        require(isinstance(self.neumann_steps, int) and self.neumann_steps >= 0, "neumann_steps",
                self.neumann_steps, "must be an integer >= 0")
        positive("psi", self.psi)
        require(len(self.zeta) == 3 and all(isinstance(z, (int, float)) and z >= 0 for z in self.zeta), "zeta",
                self.zeta, "must be three rates >= 0 for (w_bn, w_lr, eta_tilde)")
        non_negative("clip", self.clip)
        require(self.use_bnnet or self.use_lrnet, "use_bnnet", self.use_bnnet,
                "at least one meta-net must be on (use_bnnet or use_lrnet)")
        require(0.0 <= self.fixed_beta <= 1.0, "fixed_beta", self.fixed_beta, "must be in [0, 1]")
        require(isinstance(self.hidden, int) and self.hidden >= 1, "hidden", self.hidden, "must be an integer >= 1")
        positive("lr_max", self.lr_max)
        positive("init_gain", self.init_gain)
        non_negative("hidden_gain", self.hidden_gain)
        require(isinstance(self.val_batch_size, int) and self.val_batch_size >= 0, "val_batch_size",
                self.val_batch_size, "must be an integer >= 0")
        for key in ("momentum", "weight_decay", "max_grad_norm"):
            require(getattr(self, key) == 0, key, getattr(self, key),
                    "FedL2P fine-tunes with plain SGD and layer-wise learning rates; must be 0")


@dataclass(frozen=True)
class FOMAMLConfig(FedL2PConfig):
    """FedL2P (FOMAML+), App. F / Table 8."""

    meta_grad: str = "fomaml"


@dataclass(frozen=True)
class BNNetOnlyConfig(FedL2PConfig):
    """FedL2P (BNNet), Table 5: eta = lr for every tensor."""

    use_lrnet: bool = False


@dataclass(frozen=True)
class LRNetBeta1Config(FedL2PConfig):
    """FedL2P (LRNet) beta = 1, Table 5: the client's BN statistics."""

    use_bnnet: bool = False
    fixed_beta: float = 1.0


@dataclass(frozen=True)
class LRNetBeta0Config(FedL2PConfig):
    """FedL2P (LRNet) beta = 0, Table 5: the pretrained BN statistics."""

    use_bnnet: bool = False
    fixed_beta: float = 0.0


def init(model, fed, cfg, env) -> dict:
    """Alg. 1 line 1: keep theta_g, initialize lambda (seeded by the run seed)."""
    weights = get_state(model)
    spec = model_spec(model, cfg)
    lam = init_meta_params(spec, env.generator("fedl2p", "init"), env.device)
    return {"weights": weights, "lam": lam}


def broadcast(state, client_id, cfg, env) -> dict:
    """Alg. 1 line 5: theta_g and lambda."""
    return {"weights": state["weights"], "lam": state["lam"]}


def _num_samples(client) -> int:
    # N_i of Alg. 1 line 12 / Eq. 5: the client's local samples used for meta-learning.
    return client.num("train") + client.num("val")


def client_update(msg, client, client_state, cfg, env):
    """Alg. 1 lines 6-12 on one client; the payload is lambda_i."""
    ctx = prepare_client(msg["weights"], client, cfg, env)
    lam, metrics = meta_learn(ctx, msg["lam"], cfg, env, where=f"FedL2P client {client.id}")
    return Update(client.id, _num_samples(client), lam, metrics), client_state


def aggregate(state, updates, cfg, env) -> dict:
    """Alg. 1 line 14: the sample-weighted mean of the clients' lambda."""
    lams = [u.payload for u in updates]
    return {**state, "lam": weighted_mean(lams, [u.num_samples for u in updates])}


def _lam_for(state, client_state) -> dict:
    # L2P keeps each client's own lambda in its client state; FedL2P uses the server's.
    return client_state if isinstance(client_state, dict) else state["lam"]


def evaluate(state, client, client_state, cfg, env, split):
    """Personalize theta_g with the client's beta and eta, then test on ``split``."""
    model, ctx, beta, eta = personalize(state["weights"], _lam_for(state, client_state), client, cfg, env)
    return {**evaluate_model(model, client, split, device=env.device), **summary(ctx, beta, eta)}


def l2p_client_update(msg, client, client_state, cfg, env):
    """L2P: K local meta iterations on the client's own lambda (starting from the initial one)."""
    ctx = prepare_client(msg["weights"], client, cfg, env)
    start = client_state if isinstance(client_state, dict) else msg["lam"]
    lam, metrics = meta_learn(ctx, start, cfg, env, where=f"L2P client {client.id}")
    return Update(client.id, _num_samples(client), None, metrics), lam


def l2p_aggregate(state, updates, cfg, env) -> dict:
    """L2P: no federated learning; the server's lambda stays the initial one."""
    return state


FEDL2P = Algorithm(
    name="fedl2p", label="FedL2P", config=FedL2PConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate, needs_pretrained=True,
    # defined below; the lambda defers the lookup
    report=lambda state, fed, cfg, env, client_states: hyperparameter_report(state, fed, cfg, env, client_states),
)
L2P = replace(FEDL2P, name="l2p", label="L2P", client_update=l2p_client_update, aggregate=l2p_aggregate)
FEDL2P_FOMAML = replace(FEDL2P, name="fedl2p_fomaml", label="FedL2P (FOMAML+)", config=FOMAMLConfig)
FEDL2P_BNNET = replace(FEDL2P, name="fedl2p_bnnet", label="FedL2P (BNNet)", config=BNNetOnlyConfig)
FEDL2P_LRNET_BETA1 = replace(FEDL2P, name="fedl2p_lrnet_beta1", label="FedL2P (LRNet) beta=1",
                             config=LRNetBeta1Config)
FEDL2P_LRNET_BETA0 = replace(FEDL2P, name="fedl2p_lrnet_beta0", label="FedL2P (LRNet) beta=0",
                             config=LRNetBeta0Config)

VARIANTS = (FEDL2P, L2P, FEDL2P_FOMAML, FEDL2P_BNNET, FEDL2P_LRNET_BETA1, FEDL2P_LRNET_BETA0)


@torch.no_grad()
def hyperparameter_report(state, fed, cfg, env, client_states: dict | None = None, clients=None) -> list[dict]:
    """Per client: the meta-nets' inputs and outputs, for Fig. 2/4 and Tables 6 (ARI), Fig. 3/5.

    Returns one dict per client: ``client``; ``beta`` {BN layer name: beta}; ``eta``
    {parameter name: learning rate}; ``sparsity`` (share of the model's parameters whose
    learning rate is 0, sec. 4.2 footnote 6); ``tensor_sparsity`` (share of tensors with
    eta = 0); ``xi`` (BNNet's input, Eq. 3) and ``features`` (LRNet's input, Eq. 4) as lists.
    """
    client_states = client_states or {}
    ids = range(fed.num_clients) if clients is None else clients
    rows = []
    for cid in ids:
        client = fed.clients[cid]
        ctx = prepare_client(state["weights"], client, cfg, env)
        lam = {k: v.to(ctx.device) for k, v in _lam_for(state, client_states.get(cid)).items()}
        beta, eta = hyperparams(ctx, lam)
        bn_names = [n for n, _ in bn_modules(ctx.model)]
        betas = (beta.tolist() if isinstance(beta, torch.Tensor) else [float(beta)] * len(bn_names)) \
            if beta is not None else []
        rows.append({
            "client": cid,
            "beta": dict(zip(bn_names, betas)),
            "eta": dict(zip(ctx.params, eta.tolist())),
            "sparsity": sparsity(ctx, eta),
            "tensor_sparsity": float((eta == 0).double().mean()),
            "xi": ctx.stats.xi.tolist(),
            "features": ctx.stats.features.tolist(),
        })
    return rows
