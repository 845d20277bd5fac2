"""One client's side of FedL2P: meta-learning lambda (Alg. 1 lines 6-11) and personalizing.

These functions take the algorithm's config (`pflkit.algorithms.fedl2p.FedL2PConfig`,
duck-typed here) and the run's `Env`; the phase functions of the algorithm are thin
wrappers around them.

Where the IFT is applied (our reading of sec. 3.3): Alg. 1 line 9 fine-tunes the
pretrained model for e epochs with the current (beta, eta), detached, giving theta_i;
the paper identifies the stationary point theta*(lambda) of the look-ahead loss L_T
(Eq. 9-10) with the fine-tuned weights ("theta* coincides with theta'", "a single
instance of inner-loop iterations"), so line 10 takes theta* = theta_i and applies
Eq. 6-7 there with

* ``L_T(theta, lambda)`` = `pflkit.meta.functional.lookahead_loss` on two fresh training
  batches (look-ahead gradient detached by default, as the authors' code);
* ``L_V(theta, lambda)`` = `pflkit.meta.functional.validation_loss` on the client's
  validation split (the whole split, or one random batch of ``val_batch_size``).

FOMAML+ (App. F) differentiates ``L_V(theta_i - eta(lambda) g, lambda)`` instead, ``g``
the detached gradient of the same step batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from pflkit.fl.federation import Client
from pflkit.fl.train import Diverged, client_batches, set_state
from pflkit.meta.client_stats import ClientStats, client_stats
from pflkit.meta.functional import (
    Params, finetune, load_tensors, lookahead_loss, lookahead_step, model_tensors, validation_loss,
)
from pflkit.meta.hypergrad import clip_by_value, fomaml_plus, ift_hypergrad
from pflkit.meta.linear_solve import neumann
from pflkit.meta.metanets import MetaNet, MetaSpec, group_of, meta_hyperparams
from pflkit.models.introspect import bn_modules, layer_input_modules, layer_param_names
from pflkit.models.mixed_bn import convert_bn, mixed_bn_layers, set_bn_mode

__all__ = ["ClientContext", "model_spec", "scratch_model", "prepare_client", "hyperparams", "meta_step",
           "meta_learn", "sparsity", "personalize", "epoch_batches"]

SCRATCH = "fedl2p"


@dataclass
class ClientContext:
    """A client's pretrained model with its statistics: everything lines 6-7 of Alg. 1 give."""

    client: Client
    model: nn.Module
    spec: MetaSpec
    nets: dict[str, MetaNet]
    stats: ClientStats
    params: Params
    buffers: Params
    device: torch.device


def model_spec(model: nn.Module, cfg) -> MetaSpec:
    """Sizes B, M, P of ``model``'s meta-nets with the config's switches."""
    return MetaSpec(num_bn=len(bn_modules(model)), num_layers=len(layer_input_modules(model)),
                    num_tensors=len(layer_param_names(model)), use_bnnet=cfg.use_bnnet, use_lrnet=cfg.use_lrnet,
                    fixed_beta=cfg.fixed_beta, fixed_lr=cfg.lr, hidden=cfg.hidden, gain=cfg.init_gain,
                    bn_bias=cfg.bn_bias_init, lr_bias=cfg.lr_bias_init, lr_max=cfg.lr_max)


def scratch_model(env) -> nn.Module:
    """The run's cached module of the architecture with BN layers converted (Eq. 2)."""
    model = env.scratch_model(SCRATCH)
    if bn_modules(model) and not mixed_bn_layers(model):
        convert_bn(model)
    return model


def _meta_modules(spec: MetaSpec, env) -> dict[str, MetaNet]:
    # Structure only (weights come from lambda through functional_call); built on the meta
    # device so that it consumes no random numbers, cached per run.
    key = ("fedl2p-nets", spec)
    if key not in env._scratch:
        with torch.device("meta"):
            env._scratch[key] = spec.modules()
    return env._scratch[key]


def prepare_client(weights: dict, client: Client, cfg, env) -> ClientContext:
    """Load the pretrained weights and compute the client's meta-data (Alg. 1 lines 5-7)."""
    model = scratch_model(env)
    set_state(model, weights)
    stats = client_stats(model, lambda: client_batches(client, "train", device=env.device))
    params, buffers = model_tensors(model)
    spec = model_spec(model, cfg)
    stats.xi, stats.features = stats.xi.to(env.device), stats.features.to(env.device)
    return ClientContext(client, model, spec, _meta_modules(spec, env), stats, params, buffers, env.device)


def hyperparams(ctx: ClientContext, lam: dict[str, torch.Tensor]):
    """(beta, eta) of Eq. 4 for this client; beta is None for a model without BN layers."""
    beta, eta = meta_hyperparams(ctx.spec, ctx.nets, lam, ctx.stats.xi, ctx.stats.features)
    eta = eta.to(ctx.device)
    return (beta if ctx.spec.num_bn else None), eta


def epoch_batches(client: Client, cfg, generator: torch.Generator, device):
    """e shuffled epochs of the train split: the batch order of `pflkit.fl.train.local_sgd`."""
    for _ in range(cfg.epochs):
        yield from client.batches("train", cfg.batch_size, generator, shuffle=True, device=device,
                                  augment=cfg.augment)


def _val_batch(client: Client, cfg, gen: torch.Generator, device):
    # A client without a validation split meta-learns on its train split (as the authors' code).
    split = "val" if client.num("val") > 0 else "train"
    if cfg.val_batch_size > 0:
        return client.random_batch(split, cfg.val_batch_size, gen, device)
    return client.tensors(split, device)


def _losses(ctx: ClientContext, keys, buffers, step_b, loss_b, val_b, second_order: bool):
    """L_T, L_V and the look-ahead step as functions of (theta list, lambda list)."""
    names = list(ctx.params)

    def unpack(th, lm):
        return dict(zip(names, th)), hyperparams(ctx, dict(zip(keys, lm)))

    def train_loss(th, lm):
        params, (beta, eta) = unpack(th, lm)
        return lookahead_loss(ctx.model, params, buffers, step_b, loss_b, eta, beta, second_order=second_order)

    def val_loss(th, lm):
        params, (beta, _) = unpack(th, lm)
        return validation_loss(ctx.model, params, buffers, val_b, beta)

    def step(th, lm):
        params, (beta, eta) = unpack(th, lm)
        return list(lookahead_step(ctx.model, params, buffers, step_b, eta, beta).values())

    return train_loss, val_loss, step


def meta_step(ctx: ClientContext, lam: dict[str, torch.Tensor], cfg, gen: torch.Generator,
              where: str = "FedL2P") -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One iteration k of Alg. 1 lines 9-10: fine-tune, then one SGD step on lambda.

    The hypergradient (IFT, Alg. 2; or FOMAML+) is clipped by value to ``[-clip, clip]``
    and each group of lambda steps with its own rate: ``zeta = (w_bn, w_lr, eta_tilde)``.

    Returns:
        The new lambda and ``{"loss": fine-tuning loss, "val_loss": L_V(theta_i, lambda)}``.
    """
    with torch.no_grad():
        beta, eta = hyperparams(ctx, lam)
    # every iteration fine-tunes theta_g afresh ("Finetune theta_g", line 9), the client's
    # running statistics restarting from the values of line 6
    buffers = {n: b.clone() for n, b in ctx.buffers.items()}
    theta, ft = finetune(ctx.model, ctx.params, buffers, epoch_batches(ctx.client, cfg, gen, ctx.device), eta,
                         beta, skip_nonfinite=cfg.skip_nonfinite, where=where)
    step_b = ctx.client.random_batch("train", cfg.batch_size, gen, ctx.device, cfg.augment)
    loss_b = ctx.client.random_batch("train", cfg.batch_size, gen, ctx.device, cfg.augment)
    val_b = _val_batch(ctx.client, cfg, gen, ctx.device)
    keys = list(lam)
    train_loss, val_loss, step = _losses(ctx, keys, buffers, step_b, loss_b, val_b, cfg.second_order)
    th, lm = list(theta.values()), [lam[k] for k in keys]
    with torch.no_grad():
        lv = float(val_loss(th, lm))
    if cfg.meta_grad == "ift":
        solve = partial(neumann, steps=cfg.neumann_steps, psi=cfg.psi, scaled=cfg.neumann_scaled)
        grads = ift_hypergrad(train_loss, val_loss, th, lm, solve=solve)
    else:
        grads = fomaml_plus(val_loss, step, th, lm)
    if not all(bool(torch.isfinite(g).all()) for g in grads) or not math.isfinite(lv):
        if not cfg.skip_nonfinite:
            raise Diverged(f"non-finite hypergradient or validation loss in {where}")
        return lam, {"loss": ft["loss"], "val_loss": lv}
    grads = clip_by_value(grads, cfg.clip)
    zeta = dict(zip(("bnnet", "lrnet", "eta_tilde"), cfg.zeta))
    new = {k: (lam[k] - zeta[group_of(k)] * g).detach() for k, g in zip(keys, grads)}
    return new, {"loss": ft["loss"], "val_loss": lv}


def meta_learn(ctx: ClientContext, lam: dict[str, torch.Tensor], cfg, env, where: str = "FedL2P"):
    """K iterations of `meta_step` (Alg. 1 lines 8-11); returns (lambda_i, mean metrics)."""
    lam = {k: v.detach().to(ctx.device).clone() for k, v in lam.items()}
    rows = []
    for k in range(cfg.meta_iters):
        lam, row = meta_step(ctx, lam, cfg, env.generator("fedl2p", ctx.client.id, env.round, k), where)
        rows.append(row)
    metrics = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    with torch.no_grad():
        beta, eta = hyperparams(ctx, lam)
    metrics["beta_mean"] = float(beta.mean()) if isinstance(beta, torch.Tensor) else float(beta or 0.0)
    metrics["sparsity"] = sparsity(ctx, eta)
    return lam, metrics  # on the run's device, as the server keeps it


def sparsity(ctx: ClientContext, eta: torch.Tensor) -> float:
    """Share of the model's parameters whose learning rate is 0 (FedL2P sec. 4.2, footnote 6)."""
    sizes = torch.tensor([p.numel() for p in ctx.params.values()], dtype=torch.float64, device=eta.device)
    return float((sizes * (eta.detach() == 0)).sum() / sizes.sum())


def personalize(weights: dict, lam: dict[str, torch.Tensor], client: Client, cfg, env):
    """Personalization with the learned lambda: fine-tune on the train split (sec. 3.2, end).

    The batch order is the FT baselines' (generator ``("finetune", client id)``), so with
    beta = 0 / 1 and eta = lr everywhere this is FT (BN G) / FT (BN C) exactly.

    Returns:
        ``(model, ctx, beta, eta)``: the scratch module holding the personalized weights and
        client statistics, BN layers set to beta, ready for evaluation.
    """
    ctx = prepare_client(weights, client, cfg, env)
    with torch.no_grad():
        beta, eta = hyperparams(ctx, {k: v.to(ctx.device) for k, v in lam.items()})
    buffers = {n: b.clone() for n, b in ctx.buffers.items()}
    theta, _ = finetune(ctx.model, ctx.params, buffers,
                        epoch_batches(client, cfg, env.generator("finetune", client.id), ctx.device), eta, beta,
                        skip_nonfinite=cfg.skip_nonfinite, where=f"personalizing client {client.id}")
    model = load_tensors(ctx.model, theta, buffers)
    if beta is not None:
        set_bn_mode(model, "mixed", list(beta.detach().unbind()) if isinstance(beta, torch.Tensor) else beta)
    return model, ctx, beta, eta
