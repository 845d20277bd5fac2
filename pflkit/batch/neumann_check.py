"""Does FedL2P's meta step follow d L_V / d lambda? Checks of a saved run's first meta step.

Alg. 2 replaces ``H^{-1} v`` (Eq. 7; ``H`` the Hessian of L_T at the fine-tuned weights
theta_i, ``v = d L_V / d theta``) by ``p = sum_{j=0}^{Q} (I - psi H)^j v``. Up to the factor
psi this converges to ``H^{-1} v`` only when every eigenvalue mu of ``H`` lies in
``(0, 2 / psi)``: an eigenvalue outside makes term j grow like ``|1 - psi mu|^j``, and the
last term of the sum dominates it. With the paper's psi = 0.1 the bound is mu < 20.
When it fails, the implicit term of the hypergradient is mostly ``(1 - psi mu_max)^Q``
times the component of ``v`` along the top eigenvector; clipping by value (sec. 4.1)
then keeps little more than its signs. Whether the step still points downhill is a
question for the exact derivative, which this module also computes.

* `largest_eigenvalue`: the eigenvalue of largest magnitude of a symmetric operator
  (power iteration on Hessian-vector products), signed.
* `neumann_terms`: the norms ``|(I - psi A)^j b|``, j = 0..Q.
* `unrolled_hypergradient`: d L_V / d lambda differentiated through every fine-tuning
  step (the quantity Eq. 6-7 approximate), on the meta step's own batches.
* `fedl2p_step_check`: one client's meta step at a given lambda: the above, the
  hypergradient's size per group and the share of its entries that the clip changes, its
  cosine with the unrolled gradient, and L_V before and after three steps of the run's
  rule (its hypergradient; the unrolled gradient; random signs with the same entry sizes,
  a control), all on the same fine-tuning and validation batches.
* `run_step_check`: the same on the seen clients of a saved run (its pretraining
  stage's weights and federation), at the initial lambda of Alg. 1 line 1 or at the
  lambda of a FedL2P stage checkpoint (`checkpoint_lambda`); ``pflkit check-hypergradient``
  prints it.

Not run code (`pflkit.batch.versions.NOT_RUN_CODE`): a run never imports this module, and it
writes nothing into a run's folder.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from pflkit.algorithms import fedl2p, fedl2p_client as fc
from pflkit.data.datasets import load_dataset
from pflkit.run.experiments import resolve
from pflkit.fl.federation import Federation
from pflkit.fl.train import set_state
from pflkit.io import load_torch, slug
from pflkit.meta.functional import using_beta, validation_loss
from pflkit.meta.hypergrad import _grads, leaves
from pflkit.meta.linear_solve import dot
from pflkit.meta.metanets import GROUPS, group_of
from pflkit.meta.objectives import lambda_step, meta_losses
from pflkit.models.mixed_bn import MixedBatchNorm
from pflkit.run.pretraining import client_data, load_pretrain_data
from pflkit.run.environment import initial_model, make_env
from pflkit.run.stages import method_config

__all__ = ["largest_eigenvalue", "neumann_terms", "unrolled_hypergradient", "fedl2p_step_check", "run_step_check",
           "format_rows", "step_generator", "cosine", "checkpoint_lambda"]

MatVec = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


def _norm(u: Sequence[torch.Tensor]) -> float:
    return float(dot(u, u)) ** 0.5


def largest_eigenvalue(matvec: MatVec, like: Sequence[torch.Tensor], *, steps: int = 50,
                       generator: torch.Generator | None = None) -> float:
    """The eigenvalue of largest magnitude of the symmetric operator ``matvec``, signed.

    Power iteration from a Gaussian start shaped like ``like`` (drawn on the CPU from
    ``generator``); returns the Rayleigh quotient of the last iterate. ``steps`` matvecs.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"largest_eigenvalue: steps must be an integer >= 1, got {steps!r}")
    u = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in like]
    quotient = 0.0
    for _ in range(steps):
        scale = _norm(u)
        if scale == 0:
            return 0.0
        u = [t / scale for t in u]
        au = [t.detach() for t in matvec(u)]
        quotient = float(dot(u, au))
        u = au
    return quotient


def neumann_terms(matvec: MatVec, b: Sequence[torch.Tensor], *, steps: int, psi: float) -> list[float]:
    """``|(I - psi A)^j b|`` for j = 0..steps: the sizes of the terms Alg. 2 sums."""
    v = [t.detach() for t in b]
    out = [_norm(v)]
    for _ in range(steps):
        av = matvec(v)
        v = [x - psi * a.detach() for x, a in zip(v, av)]
        out.append(_norm(v))
    return out


def step_generator(env, client_id: int, k: int = 0) -> torch.Generator:
    """The generator of meta step ``k`` of ``client_id`` in ``env``'s round, as `fc.meta_learn` seeds it."""
    return env.generator("fedl2p", client_id, env.round, k)


def _problem(ctx, env, lam: dict, cfg, k: int, val_batch):
    # the first half of fc.meta_step (fine-tune, then L_T / L_V at theta_i), kept here so that the
    # checks need no change of run code; tests/test_neumann_check.py checks that it gives meta_step's L_V and step
    gen = step_generator(env, ctx.client.id, k)
    with torch.no_grad():
        beta, eta = fc.hyperparams(ctx, lam)
    theta, buffers, ft = fc._finetune(ctx, cfg, fc.epoch_batches(ctx.client, cfg, gen, ctx.device), eta, beta,
                                      "Neumann check", keep_last=cfg.lt_mode == "last_step")
    step_b, loss_b, val_b = fc._loss_batches(ctx, cfg, gen, val_batch)
    keys, last = list(lam), ft.get("last")
    losses = meta_losses(ctx.model, list(ctx.params), lambda lm: fc.hyperparams(ctx, dict(zip(keys, lm))), buffers,
                         val_b, lt_mode=cfg.lt_mode, loss_b=loss_b, step_b=step_b,
                         grads=last["grads"] if last else None, second_order=cfg.second_order)
    return losses, list(theta.values()), [lam[key] for key in keys]


def _tracked_client_stats(model, momentum_of: dict, stats: dict):
    """Forward pre-hooks that keep ``stats[layer name] = (client_mean, client_var)`` in the graph.

    They repeat the update the BN kernel makes without a graph (`pflkit.kernels.reference`:
    momentum, unbiased variance), so that L_V's evaluation-mode statistics carry their
    dependence on lambda through the fine-tuned weights and beta. Returns the hook handles.
    """
    def hook(name):
        def update(layer, inputs):
            if not layer.training or layer.mode != "mixed":
                return
            x = inputs[0]
            dims = [0] + list(range(2, x.dim()))
            n = x.numel() // x.shape[1]
            mean, var = stats[name]
            m = momentum_of[name]
            stats[name] = ((1 - m) * mean + m * x.mean(dim=dims),
                           (1 - m) * var + m * x.var(dim=dims, unbiased=False) * (n / max(n - 1, 1)))
        return update
    return [layer.register_forward_pre_hook(hook(name)) for name, layer in model.named_modules() if name in stats]


def unrolled_hypergradient(ctx, env, lam: dict[str, torch.Tensor], cfg, k: int, val_batch) -> list[torch.Tensor]:
    """d L_V / d lambda through every fine-tuning step: what Eq. 6-7 approximate, exactly.

    The e epochs of Alg. 1 line 9 are redone on the same batches as `fc.meta_step` with
    (beta, eta) = Eq. 4 (lambda) kept in the graph, ``theta_{t+1} = theta_t - eta * grad L(theta_t)``
    differentiated to second order, then L_V on ``val_batch`` with the fine-tuned weights and
    the client's running statistics after fine-tuning, themselves tracked in the graph
    (`_tracked_client_stats`). The meta-nets' clamps pass gradients straight through, as in
    the run. Memory grows with the number of steps: meant for the small models of the ``cpu``
    preset.
    """
    gen = step_generator(env, ctx.client.id, k)
    keys = list(lam)
    lm = leaves([lam[key] for key in keys])
    beta, eta = fc.hyperparams(ctx, dict(zip(keys, lm)))
    buffers = {n: b.clone() for n, b in ctx.buffers.items()}
    bn = {n: m for n, m in ctx.model.named_modules() if isinstance(m, MixedBatchNorm)}
    stats = {n: (buffers[f"{n}.client_mean"], buffers[f"{n}.client_var"]) for n in bn}
    handles = _tracked_client_stats(ctx.model, {n: m.momentum for n, m in bn.items()}, stats)
    cur = {n: t.detach() for n, t in ctx.params.items()}
    try:
        with using_beta(ctx.model, beta):
            ctx.model.train()
            for xb, yb in fc.epoch_batches(ctx.client, cfg, gen, ctx.device):
                params = {n: t if t.requires_grad else t.detach().requires_grad_(True) for n, t in cur.items()}
                loss = F.cross_entropy(functional_call(ctx.model, (params, buffers), (xb,)), yb)
                grads = torch.autograd.grad(loss, list(params.values()), create_graph=True, allow_unused=True)
                cur = {n: t - eta[i] * g if g is not None else t
                       for i, ((n, t), g) in enumerate(zip(params.items(), grads))}
    finally:
        for h in handles:
            h.remove()
    for n, (mean, var) in stats.items():
        buffers[f"{n}.client_mean"], buffers[f"{n}.client_var"] = mean, var
    _, _, val_b = fc._loss_batches(ctx, cfg, gen, val_batch)
    return [g.detach() for g in _grads(validation_loss(ctx.model, cur, buffers, val_b, beta), lm)]


def cosine(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """Cosine of the angle between two lists of tensors (nan when one is zero)."""
    na, nb = _norm(a), _norm(b)
    return float(dot(a, b)) / (na * nb) if na > 0 and nb > 0 else math.nan


def _val_loss(ctx, env, lam: dict, cfg, k: int, val_batch) -> float:
    losses, th, lm = _problem(ctx, env, lam, cfg, k, val_batch)
    with torch.no_grad():
        return float(losses[1](th, lm))


def fedl2p_step_check(ctx, env, lam: dict[str, torch.Tensor], cfg, val_batch, *, k: int = 0,
                      power_steps: int = 50) -> dict:
    """One meta step of FedL2P on ``ctx``'s client at ``lam``, taken apart (module docstring).

    Args:
        ctx: the client's `fc.ClientContext` (`fc.prepare_client`).
        env: the run's env at the round of the step (its generators draw the batches).
        lam: the meta-parameters at which the step is taken.
        cfg: FedL2P's config (its psi, Q, zeta, clip, lt_mode, meta_grad).
        val_batch: L_V's batch.
        k: which of the round's meta steps (its generator draws the fine-tuning batches).
        power_steps: Hessian-vector products of the power iteration.

    Returns:
        ``{"client", "psi", "lam_max", "psi_lam_max", "terms", "grad_norm": {group: norm}, "clipped",
        "cosine", "cosine_group": {group: cos}, "unrolled_norm": {group: norm}, "val_loss",
        "val_loss_step", "val_loss_unrolled", "val_loss_control"}``. ``cosine`` compares the
        run's hypergradient with `unrolled_hypergradient`; the ``val_loss_*`` entries are L_V
        after the run's step, after the same step rule on the unrolled gradient and after the
        control step, each recomputed with the same batches.
    """
    losses, th, lm = _problem(ctx, env, lam, cfg, k, val_batch)
    train_loss, val_loss, _ = losses
    th, lm_leaves = leaves(th), leaves(lm)
    dt = _grads(train_loss(th, lm_leaves), th, create_graph=True)

    def hvp(u):
        return [h.detach() for h in _grads(dt, th, u, retain_graph=True)]

    v = _grads(val_loss(th, lm_leaves), th)
    gen = env.generator("neumann-check", ctx.client.id, env.round, k)
    lam_max = largest_eigenvalue(hvp, th, steps=power_steps, generator=gen)
    terms = neumann_terms(hvp, v, steps=cfg.neumann_steps, psi=cfg.psi)
    with torch.no_grad():
        before = float(val_loss(th, lm))
    grads = fc._hypergradient(cfg, losses, th, lm)
    keys = list(lam)
    norms = {grp: _norm([g for k, g in zip(keys, grads) if group_of(k) == grp]) for grp in GROUPS}
    clipped = (sum(int((g.abs() > cfg.clip).sum()) for g in grads) / sum(g.numel() for g in grads)
               if cfg.clip > 0 else 0.0)
    exact = unrolled_hypergradient(ctx, env, lam, cfg, k, val_batch)
    agree = {grp: cosine(*zip(*[(g, u) for key, g, u in zip(keys, grads, exact) if group_of(key) == grp]))
             for grp in GROUPS}
    step = lambda_step(lam, grads, cfg.zeta, cfg.clip)
    signs = [torch.randint(0, 2, g.shape, generator=gen).to(g.device) * 2 - 1 for g in grads]
    bound = cfg.clip if cfg.clip > 0 else math.inf
    control = lambda_step(lam, [s * g.abs().clamp(max=bound) for s, g in zip(signs, grads)], cfg.zeta, 0.0)
    return {"client": ctx.client.id, "psi": cfg.psi, "lam_max": lam_max, "psi_lam_max": cfg.psi * lam_max,
            "terms": terms, "grad_norm": norms, "clipped": clipped, "cosine": cosine(grads, exact),
            "cosine_group": agree,
            "unrolled_norm": {grp: _norm([u for key, u in zip(keys, exact) if group_of(key) == grp]) for grp in GROUPS},
            "val_loss": before, "val_loss_step": _val_loss(ctx, env, step, cfg, k, val_batch),
            "val_loss_unrolled": _val_loss(ctx, env, lambda_step(lam, exact, cfg.zeta, cfg.clip), cfg, k, val_batch),
            "val_loss_control": _val_loss(ctx, env, control, cfg, k, val_batch)}


def checkpoint_lambda(path: str | Path, *, kept: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """(lambda, rounds done) from a FedL2P stage's checkpoint (``seedS/<stage>.ckpt``, read ``weights_only``):
    the lambda after its last completed round, or with ``kept`` the one the keep-best rule holds."""
    ck = load_torch(path)
    try:
        rounds, state = ck["best"][1:] if kept else (ck["round"], ck["state"])
        lam = state["lam"]
    except (KeyError, TypeError, ValueError):
        what = "a kept lambda" if kept else "a lambda"
        raise ValueError(f"{path}: not a FedL2P stage checkpoint with {what}") from None
    return {k: v.detach().clone() for k, v in lam.items()}, int(rounds)


def run_step_check(experiment: str | Path | dict, run_dir: str | Path, *, preset: str = "cpu", clients: int = 4,
                   seed: int = 0, changes: dict | None = None, power_steps: int = 50,
                   data_root=None, checkpoint: str | Path | None = None, kept: bool = False) -> list[dict]:
    """`fedl2p_step_check` on the first ``clients`` seen clients of a saved run.

    At the initial lambda of Alg. 1 line 1 (round 1's step), or at the lambda of a stage checkpoint
    (`checkpoint_lambda`: the step of the round after it).

    Args:
        experiment: what the run was made from: a catalog name, a TOML file or a dict
            (`pflkit.run.experiments.resolve`); its first FedL2P method is checked.
        run_dir: the run's folder (``--out`` of ``pflkit run``, or ``--work``/NAME of
            ``pflkit reproduce``): its ``seedS/federation.npz`` and the pretraining stage's
            ``seedS/<label>.weights.pt`` are read (``weights_only``).
        preset: the preset the run was made at.
        clients: how many seen clients to check.
        seed: the run's seed.
        changes: FedL2P config fields to replace (e.g. ``{"psi": 0.001}``).
        power_steps: Hessian-vector products of each power iteration.
        data_root: the data folder (None: ``$PFLKIT_DATA``).
        checkpoint: a FedL2P stage checkpoint of this run (None: the initial lambda).
        kept: with ``checkpoint``, the lambda the keep-best rule holds instead of the last one.
    """
    if not isinstance(clients, int) or clients < 1:
        raise ValueError(f"clients must be an integer >= 1, got {clients!r}")
    if kept and checkpoint is None:
        raise ValueError("kept=True needs a checkpoint")
    lam, rounds = checkpoint_lambda(checkpoint, kept=kept) if checkpoint is not None else (None, 0)
    exp = resolve(experiment, preset)
    labels = [m.label for m in exp.methods if m.algorithm == "fedl2p"]
    if not labels or exp.pretrain is None:
        raise ValueError(f"experiment {exp.name!r} has no FedL2P method after a pretraining stage")
    seed_dir = Path(run_dir) / f"seed{seed}"
    weights = seed_dir / f"{slug(exp.pretrain.label)}.weights.pt"
    for path in (seed_dir / "federation.npz", weights):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: is {run_dir} a run of {exp.name!r}?")
    _, cfg = method_config(exp, labels[0], **(changes or {}))
    dataset = load_dataset(exp.data.dataset, data_root, **exp.data.options)
    pre = load_pretrain_data(exp, data_root, False, load=load_dataset)
    fed = Federation.load(seed_dir / "federation.npz", client_data(exp, dataset, pre))
    env = make_env(exp, fed, seed).at_round(rounds)  # the generators of the round that takes the step
    model = set_state(initial_model(env), load_torch(weights))
    state = fedl2p.init(model, fed, cfg, env)
    if lam is not None:
        if set(lam) != set(state["lam"]) or any(lam[k].shape != v.shape for k, v in state["lam"].items()):
            raise ValueError(f"{checkpoint}: its lambda does not fit {exp.name!r}'s meta-nets")
        state["lam"] = {k: v.to(env.device) for k, v in lam.items()}
    rows = []
    for cid in [i for i in range(fed.num_clients) if i not in fed.unseen_ids][:clients]:
        client = fed.clients[cid]
        ctx = fc.prepare_client(state["weights"], client, cfg, env)
        val_b = next(iter(fc.val_schedule(client, cfg, env.generator("fedl2p-val", cid, env.round), ctx.device)))
        rows.append(fedl2p_step_check(ctx, env, state["lam"], cfg, val_b, power_steps=power_steps))
    return rows


def format_rows(rows: list[dict]) -> str:
    """A plain-text table of `run_step_check`'s rows (one run, one psi)."""
    psi = rows[0]["psi"]
    head = (f"{'client':>6} {'mu_max':>9} {'psi*mu':>7} {'|term Q|/|v|':>12} {'|g| bnnet':>10} {'lrnet':>9} "
            f"{'eta_tilde':>9} {'clipped':>7} {'cos':>6} {'bnnet':>6} {'lrnet':>6} {'eta_t':>6} {'L_V':>8} "
            f"{'step':>9} {'unrolled':>9} {'control':>9}")
    lines = [f"psi = {psi:g}: the series converges when every eigenvalue of H is in (0, {2 / psi:g}); cos: the "
             "hypergradient against the unrolled one (all, then per group);",
             "step / unrolled / control: L_V's change after the run's step, the unrolled gradient's, random signs",
             head]
    for r in rows:
        g = r["grad_norm"]
        lines.append(f"{r['client']:>6} {r['lam_max']:>9.3g} {r['psi_lam_max']:>7.3g} "
                     f"{r['terms'][-1] / max(r['terms'][0], 1e-30):>12.3g} {g['bnnet']:>10.3g} {g['lrnet']:>9.3g} "
                     f"{g['eta_tilde']:>9.3g} {r['clipped']:>7.1%} {r['cosine']:>+6.2f} "
                     + " ".join(f"{r['cosine_group'][grp]:>+6.2f}" for grp in GROUPS)
                     + f" {r['val_loss']:>8.4f} {r['val_loss_step'] - r['val_loss']:>+9.5f} "
                     f"{r['val_loss_unrolled'] - r['val_loss']:>+9.5f} {r['val_loss_control'] - r['val_loss']:>+9.5f}")
    return "\n".join(lines)
