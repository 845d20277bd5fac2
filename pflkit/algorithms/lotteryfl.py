"""LotteryFL (Li et al., 2020): a personal lottery-ticket subnetwork per client, pruned to zero.

Each client keeps a keep-mask m_k over the prunable weights (convolution and linear
weight tensors; biases and BN parameters are never pruned) and its own model. Each
round a sampled client (LotteryFL Alg. 1):

1. loads the global model at its kept positions (pruned positions stay 0);
2. measures the accuracy of that model on its validation split (its train split when
   it has no validation samples, as in FedSelect's 20-samples-per-class setting);
3. if the accuracy exceeds ``acc_threshold`` and its pruned share is below
   ``prune_target``, prunes the ``prune_step`` share of its remaining weights with the
   smallest magnitude (one ranking over all prunable entries) and rewinds every
   parameter to its initial value theta_0 (kept weights) or 0 (pruned);
4. trains ``local_epochs`` with pruned entries frozen at 0, keeps the result as its
   personalized model and sends the kept entries.

The server averages every entry over the clients that keep it (an entry pruned on
every sampled client keeps its global value): FedSelect's partial-model exchange
(`pflkit.algorithms.fedselect`) with travel mask = keep-mask, so only kept entries
travel up and down. theta_0 is the first global model the client receives (the run's
initialization when every client takes part in round 1, the FedSelect setting).

Defaults (``prune_step`` 0.2, ``prune_target`` 0.5, ``acc_threshold`` 0.5) are our
reading of LotteryFL's recommended settings. Evaluation tests each client's own model.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.fedselect import FEDSELECT, ExchangeConfig, filled, keep_largest, masked_sgd, receive, to_sparse
from pflkit.config import one_of, require
from pflkit.fl.algorithm import Update, replace
from pflkit.fl.train import evaluate_model, get_state, set_state


@dataclass(frozen=True)
class LotteryFLConfig(ExchangeConfig):
    """Attributes: prune_step (r_p), prune_target (r_target), acc_threshold, prune_split; the rest is
    FedSelect's `ExchangeConfig`, BN statistics always ``"shared"``."""

    method = "LotteryFL"

    prune_step: float = 0.2
    prune_target: float = 0.5
    acc_threshold: float = 0.5
    prune_split: str = "val"

    def __post_init__(self):
        super().__post_init__()
        require(0 < self.prune_step < 1, "prune_step", self.prune_step, "must be in (0, 1)")
        require(0 <= self.prune_target < 1, "prune_target", self.prune_target, "must be in [0, 1)")
        require(0 <= self.acc_threshold <= 1, "acc_threshold", self.acc_threshold, "must be in [0, 1]")
        one_of("prune_split", self.prune_split, {"val", "train"})
        require(self.bn_stats == "shared", "bn_stats", self.bn_stats, "LotteryFL averages BN statistics ('shared')")


def prunable_names(model) -> list[str]:
    """Weight tensors of convolutions and linear layers (dim > 1)."""
    return [n for n, p in model.named_parameters() if p.dim() > 1]


def pruned_share(keep: dict, names) -> float:
    total = sum(keep[n].numel() for n in names)
    return 1.0 - sum(int(keep[n].sum()) for n in names) / max(total, 1)


def prune(weights: dict, keep: dict, names, step: float) -> dict:
    """Drop the ``step`` share of kept prunable entries with the smallest |weight| (global ranking)."""
    kept = keep_largest({n: weights[n].abs() for n in names}, {n: keep[n] for n in names}, 1.0 - step)
    return {**keep, **kept}


def rewind(init: dict, keep: dict) -> dict:
    """theta_0 at kept entries, 0 at pruned ones (the lottery-ticket reset)."""
    return {k: v.masked_fill(~keep[k].to(v.device), 0) if k in keep else v.clone() for k, v in init.items()}


def client_update(msg, client, client_state, cfg, env):
    model = env.scratch_model()
    names = prunable_names(model)
    if client_state is None:
        theta0 = {k: v.clone() for k, v in msg["full"].items()}
        keep = filled(model, True)
    else:
        theta0, keep = client_state["init"], client_state["travel"]
    set_state(model, receive(msg, client_state))
    split = cfg.prune_split if client.num(cfg.prune_split) > 0 else "train"
    acc = evaluate_model(model, client, split, device=env.device)["acc"]
    pruned = pruned_share(keep, names)
    if acc > cfg.acc_threshold and pruned < cfg.prune_target:
        keep = prune(get_state(model), keep, names, cfg.prune_step)
        set_state(model, rewind(theta0, keep))
    stats = masked_sgd(model, client, keep, cfg, env, cfg.local_epochs, ("local",))
    weights = get_state(model)
    payload = to_sparse(weights, keep, buffers=True)
    metrics = {"loss": stats["loss"], "pruned_share": pruned_share(keep, names)}
    return (Update(client.id, client.num("train"), payload, metrics),
            {"weights": weights, "travel": keep, "init": theta0})


def evaluate(state, client, client_state, cfg, env, split):
    weights = state["weights"] if client_state is None else client_state["weights"]
    return evaluate_model(set_state(env.scratch_model(), weights), client, split, device=env.device)


LOTTERYFL = replace(FEDSELECT, name="lotteryfl", label="LotteryFL", config=LotteryFLConfig,
                    client_update=client_update, evaluate=evaluate)
