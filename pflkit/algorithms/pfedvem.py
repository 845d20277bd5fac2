"""pFedVEM and pFedMAP (Zhu, Ma, Blaschko, FL-NeurIPS'22): hierarchical Bayes for label concept drift.

The network is split as in FedPer: the representation ``model.features`` is shared
and averaged by sample count (FedAvg); the linear classifier ``model.head`` is
personal. Its D = C * d + C entries (weight rows, then bias) are handled as one
flat vector, and every client's head hangs off a global head ``w`` (Eq. 3-4):
``p(w_j | w) = N(w, rho_j^2 I)``.

* **pFedVEM** (Alg. 1): client j keeps a diagonal Gaussian ``q_j = N(mu_j, diag(sigma_j^2))``
  (sigma = softplus of a free parameter). Each round it sets ``rho_j^2`` by Eq. 7 for
  the received ``w``, ascends its ELBO term (Eq. 5, reparameterized Monte Carlo samples,
  analytic KL) in the head with the base frozen, trains the base on heads drawn from
  ``q_j``, re-computes ``rho_j^2`` from the new ``q_j`` (Alg. 1 line 4: Sigma^{t+1},
  mu^{t+1}, w^t) and reports ``(mu_j, rho_j^2)``. The server sets ``w`` to the
  precision-weighted mean (Eq. 7) of the reporting clients' means.
* **pFedMAP** (sec. 3): a point head ``theta_j`` per client, MAP under a flat prior on
  ``w`` and one fixed, shared ``rho``: the client minimizes its loss plus
  ``||theta_j - w||^2 / (2 rho^2)`` (Ditto's proximal personal model), the server
  sets ``w`` to the plain mean of the reported heads (Eq. 7 with equal tau).

Scale: the client objectives are divided by the client's sample count n_j (mean
cross-entropy + KL / n_j), which leaves the maximizer of Eq. 5 unchanged (the authors'
code sums the loss and uses a fixed learning rate; our head step adapts to the curvature).

Protocol (sec. 3.1, after pFedMe; ``participation``, shared with the other methods of the
tables; `pflkit.fl.sampling`): ``"broadcast"`` (default) is Alg. 1 lines 2-8. The
server broadcasts to **all** clients every round (run with the loop's ``fraction = 1``) and
every client updates its ``q_j``, but each reports only with probability
``report_fraction`` (0.1), drawn as the loop's Bernoulli sampling would draw it. A
non-reporting client updates only its head (its base update would be overwritten by the
next broadcast and is not used in evaluation, so it is skipped: ``silent_update``) and sends nothing.
``"sampled"`` lets the loop's own sampling (e.g. ``sampling = "bernoulli"``, ``fraction =
0.1``) decide: then only sampled clients train, and all of them report. ``report_fraction
= 0`` is the earlier spelling of ``"sampled"`` and still means it.

Prediction uses the posterior mean head by default (``predict = "mean"``): for a
linear head it gives the mean of the logit distribution, it is deterministic, and it
is the authors' default; ``predict = "mc"`` averages the softmax over ``eval_mc``
heads drawn from ``q_j`` (the posterior predictive).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pflkit.algorithms.fedavg import FedAvgConfig
from pflkit.config import one_of, positive, require
from pflkit.fl.aggregate import precision_weighted_mean, weighted_mean
from pflkit.fl.algorithm import Algorithm, Update
from pflkit.fl.sampling import reported
from pflkit.fl.train import check_finite, evaluate_model, get_state, round_sgd, set_state
from pflkit.models.introspect import head_param_names

# ----------------------------------------------------------------------------------------------
# Gaussian head math (pure functions of tensors; flat head vectors of length D = C * d + C)
# ----------------------------------------------------------------------------------------------


def softplus_inverse(x: torch.Tensor | float, device=None) -> torch.Tensor:
    """The raw parameter whose softplus is ``x`` > 0 (log(expm1(x)), stable for large x).

    A float ``x`` gives a 0-d tensor on ``device`` (default: the CPU).
    """
    x = torch.as_tensor(x, dtype=torch.get_default_dtype(),
                        device=x.device if isinstance(x, torch.Tensor) else (device or "cpu"))
    if (x <= 0).any():
        raise ValueError(f"softplus_inverse needs positive values, got min {float(x.min())}")
    return x + torch.log(-torch.expm1(-x))


def split_head(vec: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat head vector(s) (..., C * d + C) -> weight (..., C, d) and bias (..., C)."""
    dim = vec.shape[-1] // num_classes - 1
    weight = vec[..., : num_classes * dim].reshape(*vec.shape[:-1], num_classes, dim)
    return weight, vec[..., num_classes * dim:]


def head_logits(z: torch.Tensor, heads: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Logits of features ``z`` (n, d) under heads (D,) -> (n, C) or (K, D) -> (K, n, C)."""
    weight, bias = split_head(heads, num_classes)
    return torch.matmul(z, weight.transpose(-1, -2)) + bias.unsqueeze(-2)


def gaussian_kl(mu_q: torch.Tensor, sigma_q: torch.Tensor, mu_p: torch.Tensor,
                sigma_p: torch.Tensor | float) -> torch.Tensor:
    """KL[N(mu_q, diag sigma_q^2) || N(mu_p, diag sigma_p^2)], summed over dimensions (Eq. 5)."""
    sigma_p = torch.as_tensor(sigma_p, dtype=mu_q.dtype, device=mu_q.device)
    ratio = (sigma_q / sigma_p) ** 2
    return 0.5 * (ratio + ((mu_q - mu_p) / sigma_p) ** 2 - 1.0 - torch.log(ratio)).sum()


def rho_squared(mu: torch.Tensor, sigma: torch.Tensor, w: torch.Tensor) -> float:
    """Eq. 7 / Alg. 1 line 4: rho_j^2 = (Tr Sigma_j + ||mu_j - w||^2) / D."""
    return float(((sigma.detach() ** 2).sum() + ((mu.detach() - w) ** 2).sum()) / mu.numel())


def server_head(means: list[torch.Tensor], rho2: list[float]) -> torch.Tensor:
    """Eq. 7 / Alg. 1 line 9: w = sum_j tau_j mu_j / sum_j tau_j, tau_j = 1 / rho_j^2."""
    return precision_weighted_mean(means, [1.0 / r for r in rho2])


def server_objective(means, sigmas, rho2, w: torch.Tensor) -> torch.Tensor:
    """Eq. 6: sum_j E_{q_j}[log N(w_j; w, rho_j^2 I)] (the ELBO's terms that depend on w, rho)."""
    total = 0.0
    for mu, sigma, r in zip(means, sigmas, rho2):
        r = torch.as_tensor(r, dtype=mu.dtype, device=mu.device)
        spread = (sigma ** 2).sum() + ((mu - w) ** 2).sum()
        total = total + (-0.5 * mu.numel() * torch.log(2 * math.pi * r) - spread / (2 * r))
    return total


def sample_heads(mu: torch.Tensor, sigma: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """n reparameterized draws mu + sigma * eps from q (differentiable in mu and sigma)."""
    # drawn by the run's seeded CPU generator (the same heads on every device), then moved
    eps = torch.randn((n, mu.numel()), generator=generator, dtype=mu.dtype, device="cpu").to(mu.device)
    return mu + sigma * eps


def expected_nll(z, y, mu, sigma, num_classes: int, n_mc: int, generator) -> torch.Tensor:
    """Monte Carlo estimate of -E_q[log p(D_j | w_j)] = E_q[sum_i CE(z_i w_j, y_i)]."""
    logits = head_logits(z, sample_heads(mu, sigma, n_mc, generator), num_classes)
    return F.cross_entropy(logits.reshape(-1, num_classes), y.repeat(n_mc), reduction="sum") / n_mc


def elbo(z, y, mu, sigma, w, rho2: float, num_classes: int, n_mc: int, generator) -> dict[str, torch.Tensor]:
    """Client j's term of Eq. 5: E_q[log p(D_j | w_j)] - KL[q_j || N(w, rho_j^2 I)].

    Returns ``{"elbo", "nll", "kl"}`` (sums over the client's samples, not means).
    """
    nll = expected_nll(z, y, mu, sigma, num_classes, n_mc, generator)
    kl = gaussian_kl(mu, sigma, w, math.sqrt(rho2))
    return {"elbo": -nll - kl, "nll": nll, "kl": kl}


def map_loss(z, y, theta, w, rho2: float, num_classes: int) -> torch.Tensor:
    """pFedMAP's client objective (negative log posterior): sum_i CE + ||theta - w||^2 / (2 rho^2)."""
    nll = F.cross_entropy(head_logits(z, theta, num_classes), y, reduction="sum")
    return nll + ((theta - w) ** 2).sum() / (2 * rho2)


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PFedVEMConfig(FedAvgConfig):
    """pFedVEM settings (defaults: the authors' public code, scaled per sample).

    Attributes:
        participation: ``"broadcast"`` (sec. 3.1, Alg. 1; default) or ``"sampled"`` (module docstring).
        fraction, sampling: the loop's sampling; ``"broadcast"`` needs fraction 1 (every client).
        report_fraction: probability that a client reports under ``"broadcast"`` (0.1, sec. 3.1);
            0 = ``participation="sampled"`` (the earlier spelling).
        lr, momentum, local_epochs, batch_size: the base network's local SGD.
        head_step, head_momentum, head_steps: full-batch momentum-SGD steps on the head's
            variational parameters with the base frozen (the authors' head_epochs = 20);
            the step is ``head_step`` / (curvature bound of the objective), see `_fit_head`.
        n_mc: reparameterized samples per ELBO estimate and per base step (5).
        init_scale: sigma of a new client's q_j (its mean starts at w), hence also its first
            rho_j. The authors use 1 with a N(0, 1) initial head; scale it to the model's head
            init. With far fewer samples than head entries (n_j << D) the EM moves rho_j slowly,
            so this also sets the prior's strength for many rounds.
        predict: ``"mean"`` (posterior mean head) or ``"mc"`` (averaged softmax).
        eval_mc: samples for ``predict = "mc"``.
    """

    participation: str = "broadcast"
    fraction: float = 1.0
    report_fraction: float = 0.1
    lr: float = 0.01
    momentum: float = 0.9
    local_epochs: int = 5
    batch_size: int = 50
    head_step: float = 1.0
    head_momentum: float = 0.9
    head_steps: int = 20
    n_mc: int = 5
    init_scale: float = 1.0
    predict: str = "mean"
    eval_mc: int = 20

    def __post_init__(self):
        if self.report_fraction == 0:  # the earlier spelling of "the loop's sampling decides"
            object.__setattr__(self, "participation", "sampled")
        super().__post_init__()  # FLConfig's checks, then FedAvg's participation protocol
        require(0 < self.head_step <= 3, "head_step", self.head_step, "must be in (0, 3] (a fraction of 1 / L)")
        require(0 <= self.head_momentum < 1, "head_momentum", self.head_momentum, "must be in [0, 1)")
        require(isinstance(self.head_steps, int) and self.head_steps >= 0, "head_steps", self.head_steps,
                "must be an integer >= 0")
        require(isinstance(self.n_mc, int) and self.n_mc >= 1, "n_mc", self.n_mc, "must be an integer >= 1")
        positive("init_scale", self.init_scale)
        one_of("predict", self.predict, {"mean", "mc"})
        require(isinstance(self.eval_mc, int) and self.eval_mc >= 1, "eval_mc", self.eval_mc, "must be >= 1")


@dataclass(frozen=True)
class PFedMAPConfig(PFedVEMConfig):
    """pFedMAP: pFedVEM's settings (n_mc, init_scale, predict unused) plus the fixed ``rho``."""

    rho: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        positive("rho", self.rho)


# ----------------------------------------------------------------------------------------------
# Phases
# ----------------------------------------------------------------------------------------------


def _head_keys(env) -> list[str]:
    return head_param_names(env.scratch_model())


def init(model, fed, cfg, env) -> dict:
    """Server state: the shared base (everything but the head) and the global head mean w."""
    keys = head_param_names(model)
    state = get_state(model)
    w = torch.cat([state[k].flatten() for k in keys])  # weight rows, then bias
    return {"base": {k: v for k, v in state.items() if k not in keys}, "w": w}


def broadcast(state, client_id, cfg, env):
    """Alg. 1 line 2: w (and the shared base) to the client."""
    return {"base": state["base"], "w": state["w"]}


def _load(env, base: dict, head: torch.Tensor):
    """The scratch model with ``base`` and the flat ``head`` loaded."""
    model = env.scratch_model()
    weight, bias = split_head(head.detach(), model.head.out_features)
    w_key, b_key = _head_keys(env)
    return set_state(model, {**base, w_key: weight.clone(), b_key: bias.clone()})


@torch.no_grad()
def _features(model, client, device) -> tuple[torch.Tensor, torch.Tensor]:
    model.eval()
    zs, ys = [], []
    for xb, yb in client.batches("train", 512, device=device):
        zs.append(model.features(xb))
        ys.append(yb)
    return torch.cat(zs), torch.cat(ys)


def head_lipschitz(z: torch.Tensor) -> float:
    """Curvature bound of the mean softmax cross-entropy in a linear head (weight and bias).

    The softmax Hessian in the logits is at most 1/2, so the Hessian in (W, b) of sample i
    is at most (|z_i|^2 + 1) / 2; the mean over samples bounds the per-sample objective's.
    The same holds under Gaussian weight noise (an average of such Hessians).
    """
    return 0.5 * float((z.detach() ** 2).sum(1).mean() + 1.0)


def _fit_head(groups: list[dict], loss_fn, cfg) -> float:
    """``head_steps`` full-batch momentum-SGD steps on ``loss_fn()`` (a per-sample objective).

    Each group carries its curvature bound ``L`` (data term + prior term); its step is
    ``head_step / L``. A fixed step fails here: the prior's curvature 1 / (rho^2 n) and the
    data's (growing with the features) can each be orders of magnitude larger than the other.
    """
    opt = torch.optim.SGD([{"params": g["params"], "lr": cfg.head_step / g["L"]} for g in groups],
                          lr=cfg.head_step, momentum=cfg.head_momentum)
    for _ in range(cfg.head_steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        check_finite(float(loss.detach()), "pFedVEM head")
    with torch.no_grad():  # the objective at the head that is kept (also with head_steps = 0)
        return check_finite(float(loss_fn()), "pFedVEM head")


def _train_base(model, client, draw_heads, cfg, env) -> None:
    """The round's local SGD (`round_sgd`) on the base with the head fixed.

    Only the data term differs from FedAvg's local SGD: the mean cross-entropy of the
    features under the heads ``draw_heads()`` returns (fresh MC draws from q_j per step for
    pFedVEM, the point head for pFedMAP) instead of under ``model.head``.
    """
    body = [p for n, p in model.named_parameters() if n not in _head_keys(env)]
    C = model.head.out_features

    def criterion(net, xb, yb):
        heads = draw_heads()
        logits = head_logits(net.features(xb), heads, C).reshape(-1, C)
        return F.cross_entropy(logits, yb.repeat(len(heads)))

    round_sgd(model, client, cfg, env, params=body, criterion=criterion, where=f"client {client.id} base")


def _base_of(model, env) -> dict:
    keys = set(_head_keys(env))
    return {k: v for k, v in get_state(model).items() if k not in keys}


def _vem_head(msg, client, client_state, cfg, env):
    """Alg. 1 lines 3-5 on client j: rho_j^2 and the E-step on q_j.

    Returns ``(model, mu, sigma, new client state, metrics)``, the model holding the broadcast base and w.
    """
    w = msg["w"].to(env.device)
    if client_state is None:  # a new client's q_j starts at the global head
        client_state = {"mu": w.clone(), "raw": softplus_inverse(cfg.init_scale, w.device).expand_as(w).clone()}
    mu = client_state["mu"].to(env.device).clone().requires_grad_(True)
    raw = client_state["raw"].to(env.device).clone().requires_grad_(True)
    rho2 = rho_squared(mu, F.softplus(raw), w)  # M-step for rho_j given the new w
    model = _load(env, msg["base"], w)
    z, y = _features(model, client, env.device)
    C, n, gen = model.head.out_features, len(y), env.generator("head", client.id, env.round)

    def objective():
        return -elbo(z, y, mu, F.softplus(raw), w, rho2, C, cfg.n_mc, gen)["elbo"] / n

    L, prior = head_lipschitz(z), 1.0 / (rho2 * n)
    spread = float(F.softplus(raw.detach()).max() ** 2) / rho2  # KL curvature in raw ~ (sigma^2/rho^2 + 1) / n
    loss = _fit_head([{"params": [mu], "L": L + prior}, {"params": [raw], "L": L + (1 + spread) / n}],
                     objective, cfg)
    mu, sigma = mu.detach(), F.softplus(raw.detach())
    rho2 = rho_squared(mu, sigma, w)  # Alg. 1 line 4 with q_j^{t+1}: what the server weighs
    metrics = {"loss": loss, "rho2": rho2, "sigma": float(sigma.mean())}
    return model, mu, sigma, {"mu": mu, "raw": raw.detach(), "rho2": rho2}, metrics


def vem_silent_update(msg, client, client_state, cfg, env):
    """A client that does not report (``participation="broadcast"``): its E-step only (it keeps q_j)."""
    _, _, _, new_state, metrics = _vem_head(msg, client, client_state, cfg, env)
    return Update(client.id, client.num("train"), None, metrics), new_state


def vem_client_update(msg, client, client_state, cfg, env):
    """Alg. 1 lines 3-7 on client j: rho_j^2, E-step on q_j, base update, report (mu_j, rho_j^2)."""
    model, mu, sigma, new_state, metrics = _vem_head(msg, client, client_state, cfg, env)
    bgen = env.generator("base-heads", client.id, env.round)
    _train_base(model, client, lambda: sample_heads(mu, sigma, cfg.n_mc, bgen), cfg, env)
    # rho2 travels as a host scalar: the server reads it as a number (no device sync)
    payload = {"base": _base_of(model, env), "mu": mu, "rho2": torch.tensor(new_state["rho2"], device="cpu")}
    return Update(client.id, client.num("train"), payload, metrics), new_state


def _map_head(msg, client, client_state, cfg, env):
    """pFedMAP on client j: the proximal head step toward w (fixed rho). Returns ``(model, theta, metrics)``."""
    w = msg["w"].to(env.device)
    theta = (w if client_state is None else client_state["mu"].to(env.device)).clone().requires_grad_(True)
    model = _load(env, msg["base"], w)
    z, y = _features(model, client, env.device)
    C, n, rho2 = model.head.out_features, len(y), cfg.rho ** 2
    groups = [{"params": [theta], "L": head_lipschitz(z) + 1.0 / (rho2 * n)}]
    loss = _fit_head(groups, lambda: map_loss(z, y, theta, w, rho2, C) / n, cfg)
    theta = theta.detach()
    return model, theta, {"loss": loss, "dist2": float(((theta - w) ** 2).sum())}


def map_silent_update(msg, client, client_state, cfg, env):
    """A pFedMAP client that does not report (``participation="broadcast"``): its head step only."""
    _, theta, metrics = _map_head(msg, client, client_state, cfg, env)
    return Update(client.id, client.num("train"), None, metrics), {"mu": theta}


def map_client_update(msg, client, client_state, cfg, env):
    """pFedMAP on client j: proximal head step toward w (fixed rho), base update, report theta_j."""
    model, theta, metrics = _map_head(msg, client, client_state, cfg, env)
    _train_base(model, client, lambda: theta.unsqueeze(0), cfg, env)
    payload = {"base": _base_of(model, env), "mu": theta, "rho2": torch.tensor(cfg.rho ** 2, device="cpu")}
    return Update(client.id, client.num("train"), payload, metrics), {"mu": theta}


def aggregate(state, updates, cfg, env) -> dict:
    """Base: sample-weighted mean; head: Eq. 7 over the clients that reported (none: unchanged)."""
    got = reported(updates)
    if not got:
        return state
    base = weighted_mean([u.payload["base"] for u in got], [u.num_samples for u in got])
    w = server_head([u.payload["mu"] for u in got], [float(u.payload["rho2"]) for u in got])
    return {**state, "base": base, "w": w}


@torch.no_grad()
def _evaluate_mc(model, mu, sigma, client, split, cfg, env) -> dict:
    """Posterior predictive: softmax averaged over ``eval_mc`` heads drawn from q_j.

    Not `evaluate_model`: there is no single network to run. The prediction is a mixture
    (the mean of ``eval_mc`` softmaxes) and its loss the NLL of that mixture, which is not the
    cross-entropy of any one set of logits (``predict="mean"`` does use `evaluate_model`).
    """
    model.eval()
    gen, C = env.generator("eval-heads", client.id), model.head.out_features
    heads = sample_heads(mu, sigma, cfg.eval_mc, gen)
    correct, nll, n = 0, 0.0, 0
    for xb, yb in client.batches(split, 512, device=env.device):
        prob = torch.softmax(head_logits(model.features(xb), heads, C), -1).mean(0)
        nll += float(F.nll_loss(torch.log(prob.clamp_min(1e-12)), yb, reduction="sum"))
        correct += int((prob.argmax(1) == yb).sum())
        n += len(yb)
    if n == 0:
        return {"acc": float("nan"), "loss": float("nan"), "n": 0, "correct": 0}
    return {"acc": correct / n, "loss": nll / n, "n": n, "correct": correct}


def evaluate(state, client, client_state, cfg, env, split):
    """Shared base + the client's head (its posterior mean, or the MC predictive); w if never trained."""
    mu = state["w"] if client_state is None else client_state["mu"]
    model = _load(env, state["base"], mu)
    if cfg.predict == "mc" and client_state is not None and "raw" in client_state:
        return _evaluate_mc(model, mu, F.softplus(client_state["raw"]), client, split, cfg, env)
    return evaluate_model(model, client, split, device=env.device)


def trust_report(state, fed, cfg, env, client_states) -> dict:
    """Per client (None if never trained): n_j, Eq. 7's rho_j^2 against the final w and its two
    parts Tr Sigma_j / D and ||mu_j - w||^2 / D, and the share of tau_j = 1 / rho_j^2 in w."""
    w, rows = state["w"], {}
    for j, s in client_states.items():
        sigma = F.softplus(s["raw"]) if "raw" in s else torch.zeros_like(w)  # pFedMAP: a point head
        spread, dist = float((sigma ** 2).mean()), float(((s["mu"] - w) ** 2).mean())
        rows[j] = (spread + dist if "raw" in s else cfg.rho ** 2, spread, dist)
    total = sum(1 / r[0] for r in rows.values())
    out = {"n_train": [c.num("train") for c in fed.clients]}
    for k, key in enumerate(("rho2", "trace_per_dim", "dist2_per_dim")):
        out[key] = [rows[j][k] if j in rows else None for j in range(fed.num_clients)]
    out["tau_share"] = [1 / rows[j][0] / total if j in rows else None for j in range(fed.num_clients)]
    return out


def global_model(state) -> dict:
    """The server's model: the shared base and the global head mean w (flat)."""
    return {"base": state["base"], "w": state["w"]}


PFEDVEM = Algorithm(
    name="pfedvem", label="pFedVEM", config=PFedVEMConfig, init=init, broadcast=broadcast,
    client_update=vem_client_update, aggregate=aggregate, evaluate=evaluate, global_model=global_model,
    report=trust_report, silent_update=vem_silent_update,
)

PFEDMAP = Algorithm(
    name="pfedmap", label="pFedMAP", config=PFedMAPConfig, init=init, broadcast=broadcast,
    client_update=map_client_update, aggregate=aggregate, evaluate=evaluate, global_model=global_model,
    report=trust_report, silent_update=map_silent_update,
)
