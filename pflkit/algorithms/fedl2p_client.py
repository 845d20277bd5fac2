"""One client's side of FedL2P: meta-learning lambda (Alg. 1 lines 5-12) and personalizing.

The phase functions of `pflkit.algorithms.fedl2p` are thin wrappers around these. They
take the algorithm's config (`FedL2PConfig`, duck-typed here) and the run's `Env`, and
they decide which of the client's batches feed the generic meta-learning math of
`pflkit.meta` (functional fine-tuning, the losses of `pflkit.meta.objectives`, the
hypergradients and solves) and in what order.

Client statistics (``client_stats_init``): Alg. 1 lines 6-7 pass the client's train split
through the pretrained model for the meta-nets' inputs; the client's BN running statistics
then start at mean 0 / variance 1 before every fine-tuning (``"reset"``, the authors' code)
or keep that pass's moments (``"pass"``), see `pflkit.models.mixed_bn`.

Meta schedule (``meta_schedule``, Alg. 1 line 8's K):

* ``"passes"`` (default, the authors' code): ``meta_iters`` passes over the validation split
  in shuffled batches of ``val_batch_size`` (32), one meta step per batch, i.e.
  ``meta_iters * ceil(|V| / val_batch_size)`` steps (``val_batch_size = 0``: one step per
  pass on the whole split);
* ``"steps"``: K = ``meta_iters`` steps, L_V on the whole split (``val_batch_size = 0``) or
  on one random batch of ``val_batch_size`` per step.

Each meta step fine-tunes theta_g afresh (line 9) and takes one SGD step on lambda (line 10)
along the hypergradient at theta_i (where the IFT is applied and which L_T: our reading of
sec. 3.3 in `pflkit.meta.objectives`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch
from torch import nn

from pflkit.errors import Diverged
from pflkit.fl.federation import Client
from pflkit.fl.train import client_batches, set_state
from pflkit.meta.client_stats import ClientStats, client_stats
from pflkit.meta.functional import Batch, Params, finetune, load_tensors, model_tensors
from pflkit.meta.hypergrad import fomaml_plus, ift_hypergrad
from pflkit.meta.linear_solve import neumann
from pflkit.meta.metanets import MetaNet, MetaSpec, meta_hyperparams
from pflkit.meta.objectives import lambda_step, meta_losses
from pflkit.models.introspect import bn_modules, layer_input_modules, layer_param_names
from pflkit.models.mixed_bn import convert_bn, mixed_bn_layers, reset_client_stats, set_bn_mode

__all__ = ["ClientContext", "META_SCHEDULES", "model_spec", "scratch_model", "prepare_client", "hyperparams",
           "epoch_batches", "val_schedule", "num_meta_steps", "meta_step", "meta_learn", "summary", "sparsity",
           "personalize"]

META_SCHEDULES = ("passes", "steps")

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
                    bn_bias=cfg.bn_bias_init, lr_bias=cfg.lr_bias_init, lr_max=cfg.lr_max,
                    hidden_gain=cfg.hidden_gain)


def scratch_model(env) -> nn.Module:
    """The run's cached module of the architecture with BN layers converted (Eq. 2)."""
    model = env.scratch_model(SCRATCH)
    if bn_modules(model) and not mixed_bn_layers(model):
        convert_bn(model)
    return model


def _meta_modules(spec: MetaSpec, env) -> dict[str, MetaNet]:
    # Structure only (weights come from lambda through functional_call); built on the meta
    # device so that it consumes no random numbers, cached per run.
    def build():
        with torch.device("meta"):
            return spec.modules()

    return env.cached(("fedl2p-nets", spec), build)


def prepare_client(weights: dict, client: Client, cfg, env) -> ClientContext:
    """Load the pretrained weights and compute the client's meta-data (Alg. 1 lines 5-7).

    The client's BN running statistics in ``ctx.buffers`` (and the module) then start as
    ``cfg.client_stats_init`` says: mean 0 / variance 1 (``"reset"``) or the pass's moments.
    """
    model = scratch_model(env)
    set_state(model, weights)
    # the pass sets the client statistics to its moments ("pass"); "reset" then clears them
    stats = client_stats(model, partial(client_batches, client, "train", device=env.device))
    if stats.bn_stats and cfg.client_stats_init == "reset":
        reset_client_stats(model)
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


def _val_split(client: Client) -> str:
    # A client without a validation split meta-learns on its train split (as the authors' code).
    return "val" if client.num("val") > 0 else "train"


def _val_batch(client: Client, cfg, gen: torch.Generator, device):
    """L_V's batch of one meta step under ``meta_schedule="steps"``."""
    split = _val_split(client)
    if cfg.val_batch_size > 0:
        return client.random_batch(split, cfg.val_batch_size, gen, device)
    return client.tensors(split, device)


def val_schedule(client: Client, cfg, generator: torch.Generator, device) -> Iterator[Batch | None]:
    """The validation batch of every meta step of one client's round (Alg. 1 lines 8-11).

    ``"passes"``: ``meta_iters`` shuffled passes over the validation split in batches of
    ``val_batch_size`` (the last one of a pass smaller), or the whole split once per pass
    when ``val_batch_size = 0``. ``"steps"``: ``meta_iters`` times None (`meta_step` then
    draws its own batch, `_val_batch`).
    """
    if cfg.meta_schedule == "steps":
        yield from [None] * cfg.meta_iters
        return
    split = _val_split(client)
    for _ in range(cfg.meta_iters):
        if cfg.val_batch_size == 0:
            yield client.tensors(split, device)
        else:
            yield from client.batches(split, cfg.val_batch_size, generator, shuffle=True, device=device)


def num_meta_steps(client: Client, cfg) -> int:
    """How many meta steps `meta_learn` takes on ``client`` (``len(list(val_schedule(...)))``)."""
    if cfg.meta_schedule == "steps" or cfg.val_batch_size == 0:
        return cfg.meta_iters
    return cfg.meta_iters * math.ceil(client.num(_val_split(client)) / cfg.val_batch_size)


def _finetune(ctx: ClientContext, cfg, batches, eta, beta, where: str, keep_last: bool = False):
    """Alg. 1 line 9 (and personalization): fine-tune theta_g afresh on ``batches``.

    The client's running statistics restart from their values before fine-tuning (a copy
    of ``ctx.buffers``). Returns ``(theta_i, buffers after fine-tuning, stats)``.
    """
    buffers = {n: b.clone() for n, b in ctx.buffers.items()}
    theta, stats = finetune(ctx.model, ctx.params, buffers, batches, eta, beta, skip_nonfinite=cfg.skip_nonfinite,
                            where=where, keep_last=keep_last)
    return theta, buffers, stats


def _loss_batches(ctx: ClientContext, cfg, gen: torch.Generator, val_batch: Batch | None):
    """The batches of one meta step's losses, drawn from ``gen`` after fine-tuning.

    L_T's training batches (``"lookahead"``: a step batch before the loss batch, Eq. 10 / 9),
    then L_V's batch when the schedule gave none (``meta_schedule="steps"``).
    Returns ``(step_b, loss_b, val_b)``.
    """
    draw = partial(ctx.client.random_batch, "train", cfg.batch_size, gen, ctx.device, cfg.augment)
    step_b = None if cfg.lt_mode == "last_step" else draw()
    loss_b = draw()
    val_b = val_batch if val_batch is not None else _val_batch(ctx.client, cfg, gen, ctx.device)
    return step_b, loss_b, val_b


def _hypergradient(cfg, losses, th: list, lm: list) -> list[torch.Tensor]:
    """d L_V / d lambda at theta_i: the IFT of Eq. 6-7 with Alg. 2's Neumann solve, or FOMAML+ (App. F)."""
    train_loss, val_loss, step = losses
    if cfg.meta_grad == "ift":
        solve = partial(neumann, steps=cfg.neumann_steps, psi=cfg.psi, scaled=cfg.neumann_scaled)
        return ift_hypergrad(train_loss, val_loss, th, lm, solve=solve)
    return fomaml_plus(val_loss, step, th, lm)


def _finite(grads: list[torch.Tensor], value: float) -> bool:
    return all(bool(torch.isfinite(g).all()) for g in grads) and math.isfinite(value)


def meta_step(ctx: ClientContext, lam: dict[str, torch.Tensor], cfg, gen: torch.Generator,
              where: str = "FedL2P", val_batch: Batch | None = None
              ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One meta step of Alg. 1 lines 9-10: fine-tune, then one SGD step on lambda.

    The hypergradient (IFT, Alg. 2; or FOMAML+) is clipped by value to ``[-clip, clip]``
    and each group of lambda steps with its own rate: ``zeta = (w_bn, w_lr, eta_tilde)``
    (`pflkit.meta.objectives.lambda_step`). Training batches come from ``gen``: the e
    fine-tuning epochs, then L_T's batches (`_loss_batches`). ``val_batch`` is L_V's batch
    (None: drawn here, ``meta_schedule="steps"``).

    Returns:
        The new lambda and ``{"loss": fine-tuning loss, "val_loss": L_V(theta_i, lambda)}``.
    """
    with torch.no_grad():
        beta, eta = hyperparams(ctx, lam)
    last_step = cfg.lt_mode == "last_step"
    theta, buffers, ft = _finetune(ctx, cfg, epoch_batches(ctx.client, cfg, gen, ctx.device), eta, beta, where,
                                   keep_last=last_step)
    step_b, loss_b, val_b = _loss_batches(ctx, cfg, gen, val_batch)
    keys = list(lam)
    last = ft.get("last")
    losses = meta_losses(
        ctx.model, list(ctx.params), lambda lm: hyperparams(ctx, dict(zip(keys, lm))), buffers, val_b,
        lt_mode=cfg.lt_mode, loss_b=loss_b, step_b=step_b, grads=last["grads"] if last else None,
        second_order=cfg.second_order)
    th, lm = list(theta.values()), [lam[k] for k in keys]
    with torch.no_grad():
        lv = float(losses[1](th, lm))
    grads = _hypergradient(cfg, losses, th, lm)
    row = {"loss": ft["loss"], "val_loss": lv}
    if not _finite(grads, lv):
        if not cfg.skip_nonfinite:
            raise Diverged(f"non-finite hypergradient or validation loss in {where}")
        return lam, row
    return lambda_step(lam, grads, cfg.zeta, cfg.clip), row


def meta_learn(ctx: ClientContext, lam: dict[str, torch.Tensor], cfg, env, where: str = "FedL2P"):
    """Alg. 1 lines 8-11: one `meta_step` per batch of `val_schedule`; returns (lambda_i, mean metrics)."""
    lam = {k: v.detach().to(ctx.device).clone() for k, v in lam.items()}
    rows = []
    val_gen = env.generator("fedl2p-val", ctx.client.id, env.round)
    for k, val_b in enumerate(val_schedule(ctx.client, cfg, val_gen, ctx.device)):
        lam, row = meta_step(ctx, lam, cfg, env.generator("fedl2p", ctx.client.id, env.round, k), where,
                             val_batch=val_b)
        rows.append(row)
    metrics = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    with torch.no_grad():
        beta, eta = hyperparams(ctx, lam)
    return lam, {**metrics, **summary(ctx, beta, eta)}  # lambda on the run's device, as the server keeps it


def summary(ctx: ClientContext, beta, eta: torch.Tensor) -> dict[str, float]:
    """The client's mean beta (Eq. 2) and the `sparsity` of its eta (Eq. 4), for the metrics rows."""
    mean_beta = float(beta.mean()) if isinstance(beta, torch.Tensor) else float(beta or 0.0)
    return {"beta_mean": mean_beta, "sparsity": sparsity(ctx, eta)}


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
    batches = epoch_batches(client, cfg, env.generator("finetune", client.id), ctx.device)
    theta, buffers, _ = _finetune(ctx, cfg, batches, eta, beta, where=f"personalizing client {client.id}")
    model = load_tensors(ctx.model, theta, buffers)
    if beta is not None:
        set_bn_mode(model, "mixed", list(beta.detach().unbind()) if isinstance(beta, torch.Tensor) else beta)
    return model, ctx, beta, eta
