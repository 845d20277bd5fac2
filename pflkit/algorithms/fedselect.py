"""FedSelect (Tamirisa et al.): GradLTN (Alg. 1), LocalAlt, mask-aware averaging (Alg. 2), FedSelectv2.

Each round, every sampled client k

1. rebuilds theta_k^{t-1}: the global parameters at its shared positions, its own
   values at its personal positions (Alg. 2, last lines);
2. runs **GradLTN** (Alg. 1, `grad_ltn`) from theta_0 = theta_k^{t-1} to choose its
   personal mask m_k^t;
3. runs **LocalAlt** (`local_alt`, Pillutla et al. 2022) from GradLTN's returned start:
   full passes over the client's data that alternate between updating only the personal
   entries and only the shared ones (how many: below);
4. sends the values at its shared positions (and its mask) to the server, which
   averages every entry over the clients for which it is shared (`aggregate`,
   `pflkit.fl.aggregate.masked_mean`; an entry personal on every sampled client
   keeps its previous global value) and ORs the client masks into m_G.

**How p maps to the per-iteration share** (our reading of Alg. 1 and sec. 2.3.2).
GradLTN is called with r = 1 - p; mask m_i keeps "the largest (1 - r)% values in
gamma = |theta_i - theta_{i-1}| * m_{i-1}". We take the share over the entries still
in m_{i-1}: of the n_{i-1} candidates, the round(p * n_{i-1}) (at least 1) that moved
most in the last iteration stay trainable; the other (1 - p) share is frozen for good
("(1 - p) x 100% parameters are frozen during each of GradLTN's iterations"). So the
frozen (shared) set only grows, by (1 - p) of the remaining candidates per
iteration, and the personal set m_L = the surviving candidates holds about p^L of
the eligible entries (p = 0.5, L = 5: 3.1%). The paper notes p "does not directly
reflect the final percentage", which this reading explains; reading the share over
all entries instead would stop the mask changing after the first iteration.
Larger p: more personal entries, fewer shared ones, less communication (sec. 2.3.2).
The ranking is over the whole parameter vector by default (``ranking="global"``,
gamma is one vector in Alg. 1); ``ranking="layer"`` applies the share per tensor.

**The authors' code** (papers/reference-implementations.md) grows the mask across rounds
instead, and ``schedule="rounds"`` offers it: the personal mask persists in the client state;
each round the client runs LocalAlt with it, then, among the still-shared eligible entries,
the share p that moved most during that training becomes personal, until ``target`` (80%)
of the eligible entries is personal (there p = 0.25 and ``scope="weights"``). The mask then
only grows: 1 - (1 - p)^r after r rounds. GradLTN is not run; FedSelectv2 does not apply.

**What "5 epochs of LocalAlt" is** (``alt_epoch``). Sec. 2.3.2: LocalAlt alternates "full
passes of stochastic gradient descent between the two sets of parameters"; sec. 3: "5 epochs of
personalized training via LocalAlt", and, for the comparison, "we fix the number of local epochs
across all methods to 5". An epoch is one full pass over the client's data, so by default
(``alt_epoch="pass"``) ``local_epochs`` E counts passes in all: personal, shared, personal, ...
(ceil(E/2) personal and floor(E/2) shared passes; E = 5: 3 and 2), the same 5 passes every other
method of Table 1 makes. The authors' code (papers/reference-implementations.md) makes each of its
LocalAlt epochs a personal pass followed by a shared pass, 2E passes for E epochs:
``alt_epoch="pair"`` (pflkit's behaviour before this reading was settled). A part with no entries
(the authors' schedule before its first growth) gives its passes to the other part under ``"pass"``,
so the round still makes E passes; under ``"pair"`` such a pass is skipped.

Iteration count: i = 0 trains every eligible entry, i = 1..L each select then train,
so L selections and L + 1 training phases of E epochs. FedSelect returns theta_0
(the last phase's result would be discarded, so it is skipped); **FedSelectv2**
(``start="theta_L"``) returns theta_L, the model after the last phase (personal
entries fine-tuned from theta_0, the rest frozen at theta_0), as LocalAlt's start.

**BN statistics and biases.** ``scope="all"`` (default, the paper's theta): every
parameter entry, biases and BatchNorm weights included, may become personal.
``scope="weights"`` (the authors' code, papers/reference-implementations.md): only
weight tensors of convolutions and linear layers are eligible; biases and BN affine
parameters are always shared. BN running statistics are buffers, not parameters: no
mask covers them. ``bn_stats="shared"`` (default) sends them and averages them by
sample count like FedAvg; ``bn_stats="local"`` keeps them on the client (FedBN).
GradLTN resets the whole state (buffers included) to theta_0 at each iteration.

**Communication** (what ``nbytes`` counts). Up: the values at the client's shared
positions (a whole tensor when entirely shared, a 1-D tensor of its shared entries when
partly shared, nothing when entirely personal) plus, for partly shared tensors, the mask
(`encode_mask`: packed bits, numel / 8 bytes, or the int32 positions of the personal
entries when fewer), plus BN buffers when shared. Down: only the global values at the
positions the client shared last round (the server keeps each client's last mask, and
the client knows it); a client's first message is the full global model. Alg. 2's
write-back of the global values into each client's non-personal positions happens when
the client next receives them (`receive`) and when it is evaluated (`personalized_state`).

Frozen means frozen: masked training multiplies gradients by the mask (weight decay
is folded into the loss so it is masked too), so frozen entries never move.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from pflkit.config import OMIT_DEFAULT, fraction, one_of, require
from pflkit.fl.aggregate import masked_mean, weighted_mean
from pflkit.fl.algorithm import Algorithm, FLConfig, Update, replace
from pflkit.fl.train import evaluate_model, get_state, round_sgd, set_state
from pflkit.models.introspect import head_param_names

Mask = dict[str, torch.Tensor]  # parameter name -> bool tensor of its shape
ALT_EPOCHS = {"pass", "pair"}  # what one LocalAlt epoch is (`alt_schedule`)


@dataclass(frozen=True)
class ExchangeConfig(FLConfig):
    """What every method on the partial-model exchange below shares (FedSelect, FedAlt, FedRep, LotteryFL).

    FedSelect's Table 1 setting (every client each round, 5 local epochs: ``fraction``,
    ``local_epochs``); training by epochs only (`masked_sgd`, so ``local_steps`` must be 0);
    ``bn_stats``: ``"shared"`` (sent and averaged by sample count) or ``"local"`` (FedBN) BN
    running statistics, read by `broadcast`, `finish_update` and `personalized_state`.
    """

    method: ClassVar[str] = "FedSelect"  # how errors name the method

    fraction: float = 1.0
    local_epochs: int = 5
    bn_stats: str = "shared"

    def __post_init__(self):
        super().__post_init__()
        require(self.local_steps == 0, "local_steps", self.local_steps, f"{self.method} trains by epochs; use 0")
        one_of("bn_stats", self.bn_stats, {"shared", "local"})


@dataclass(frozen=True)
class FedSelectConfig(ExchangeConfig):
    """FedSelect's settings (sec. 3: L = 5 iterations of E = 5 epochs, 5 LocalAlt epochs, K = 1).

    Attributes:
        personalization_rate: p in (0, 1]; the share of GradLTN candidates that stay
            candidates per iteration (module docstring).
        ltn_iterations: L, mask selections per GradLTN call.
        ltn_epochs: E, local epochs per GradLTN training phase.
        local_epochs: LocalAlt epochs E (``alt_epoch`` says what one is).
        alt_epoch: ``"pass"`` (E passes in all, alternating personal / shared; FedSelect sec. 3)
            or ``"pair"`` (each epoch a personal then a shared pass, 2E passes; the authors' code).
        start: ``"theta_0"`` (FedSelect) or ``"theta_L"`` (FedSelectv2).
        scope: ``"all"`` parameters eligible, or ``"weights"`` (conv / linear weights only).
        ranking: ``"global"`` (one ranking over all eligible entries) or ``"layer"``.
        bn_stats: ``"shared"`` (averaged) or ``"local"`` BN running statistics.
        schedule: ``"gradltn"`` (Alg. 1 each round) or ``"rounds"`` (the authors' code:
            the personal mask persists and grows across rounds; module docstring).
        target: ``"rounds"`` only: personal share of the eligible entries where growth stops.
        report_head_iou: the report also keeps Fig. 1's matrix, the IoU of every pair of clients' personal
            masks in the final linear layer, and each client's personal share there (`mask_report`).
    """

    alt_epoch: str = "pass"
    personalization_rate: float = 0.5
    ltn_iterations: int = 5
    ltn_epochs: int = 5
    start: str = "theta_0"
    scope: str = "all"
    ranking: str = "global"
    schedule: str = "gradltn"
    target: float = 0.8
    report_head_iou: bool = field(default=False, metadata=OMIT_DEFAULT)  # off: the report as before

    def __post_init__(self):
        super().__post_init__()
        fraction("personalization_rate", self.personalization_rate)
        one_of("schedule", self.schedule, {"gradltn", "rounds"})
        fraction("target", self.target)
        require(self.schedule == "gradltn" or self.start == "theta_0", "start", self.start,
                "theta_L (FedSelectv2) needs schedule='gradltn'")
        require(self.ltn_iterations >= 1, "ltn_iterations", self.ltn_iterations, "must be >= 1")
        require(self.ltn_epochs >= 1, "ltn_epochs", self.ltn_epochs, "must be >= 1")
        one_of("start", self.start, {"theta_0", "theta_L"})
        one_of("scope", self.scope, {"all", "weights"})
        one_of("ranking", self.ranking, {"global", "layer"})
        one_of("alt_epoch", self.alt_epoch, ALT_EPOCHS)


@dataclass(frozen=True)
class FedSelectV2Config(FedSelectConfig):
    """FedSelectv2: LocalAlt starts from GradLTN's theta_L (sec. 2.3.2, last paragraph)."""

    start: str = "theta_L"


# ---------------------------------------------------------------------------------------------
# masks and masked training
# ---------------------------------------------------------------------------------------------


def eligible_names(model: nn.Module, scope: str = "all") -> list[str]:
    """Parameters whose entries may become personal: all, or (``"weights"``) tensors with dim > 1."""
    one_of("scope", scope, {"all", "weights"})
    return [n for n, p in model.named_parameters() if scope == "all" or p.dim() > 1]


def filled(model: nn.Module, value: bool, names=None) -> Mask:
    """A mask of every parameter (or of ``names``) set to ``value``.

    Masks live on the host, as every mask of this module (chosen by `keep_largest` from CPU
    scores, so ties break alike on every device; sent as bits); users move them to the device.
    """
    return {n: torch.full(p.shape, value, dtype=torch.bool, device="cpu") for n, p in model.named_parameters()
            if names is None or n in names}


def keep_largest(scores: dict[str, torch.Tensor], candidates: Mask, share: float, ranking: str = "global") -> Mask:
    """Among the ``candidates``, keep the round(share * n) (at least 1) with the largest scores.

    ``ranking="global"`` ranks all candidate entries together; ``"layer"`` keeps the share
    within each tensor. Ties are broken by `torch.topk`'s (deterministic) order.
    """
    if not 0 < share <= 1:
        raise ValueError(f"share={share!r}: must be in (0, 1]")
    one_of("ranking", ranking, {"global", "layer"})
    groups = [list(candidates)] if ranking == "global" else [[n] for n in candidates]
    out = {}
    for names in groups:
        cand = torch.cat([candidates[n].flatten() for n in names])
        # ranked where the masks live (the host): ties break alike whichever device made the scores
        score = torch.cat([scores[n].detach().flatten().float().to(cand.device) for n in names])
        n = int(cand.sum())
        keep = torch.zeros_like(cand)
        if n > 0:
            k = max(1, int(round(share * n)))
            keep[torch.topk(torch.where(cand, score, -math.inf), k).indices] = True
        for name, part in zip(names, torch.split(keep, [candidates[m].numel() for m in names])):
            out[name] = part.view_as(candidates[name])
    return out


def masked_parameters(model: nn.Module, trainable: Mask) -> tuple[list[nn.Parameter], list[torch.Tensor | None]]:
    """(the parameters with a trainable entry, a gradient mask for each: None where every entry trains)."""
    params = dict(model.named_parameters())
    chosen, masks = [], []
    for name, m in trainable.items():
        if not bool(m.any()):
            continue
        p = params[name]
        chosen.append(p)
        masks.append(None if bool(m.all()) else m.to(device=p.device, dtype=p.dtype))
    return chosen, masks


def masked_sgd(model: nn.Module, client, trainable: Mask, cfg: FLConfig, env, epochs: int, key=()) -> dict:
    """``epochs`` of local SGD moving only the ``trainable`` entries (names absent are frozen).

    The batches come from ``env.generator("client", id, round, *key)``. The weight decay is a
    loss term (`local_sgd`'s ``loss_decay``): SGD's own would move frozen entries, the gradient
    masks stop this one.
    """
    params, masks = masked_parameters(model, trainable)
    if not params or epochs == 0:
        return {"loss": math.nan, "steps": 0, "samples": 0}
    try:
        return round_sgd(model, client, cfg, env, key=key, epochs=epochs, steps=0, weight_decay=0.0, params=params,
                         grad_masks=masks, loss_decay=cfg.weight_decay,
                         where=f"client {client.id} {'/'.join(map(str, key))}")
    finally:
        model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# GradLTN (Alg. 1) and LocalAlt
# ---------------------------------------------------------------------------------------------


@dataclass
class LTNResult:
    """GradLTN's output: LocalAlt's start (theta_0 or theta_L), the personal mask m_L, a trace.

    ``trace`` (with ``keep_trace``) lists per iteration i the candidate mask m_i and the
    change |theta_i - theta_{i-1}| that chose it (None for i = 0).
    """

    start: dict[str, torch.Tensor]
    mask: Mask
    trace: list[tuple[Mask, dict | None]] = field(default_factory=list)

    @property
    def shared(self) -> dict[str, torch.Tensor]:
        """theta ⊙ ¬m_L: the start's values at shared positions (0 at personal ones)."""
        return {n: torch.where(self.mask[n], torch.zeros_like(v), v) if n in self.mask else v
                for n, v in self.start.items()}

    @property
    def personal(self) -> dict[str, torch.Tensor]:
        """theta ⊙ m_L: the start's values at personal positions (0 elsewhere)."""
        return {n: torch.where(m, self.start[n], torch.zeros_like(self.start[n])) for n, m in self.mask.items()}


def grad_ltn(model: nn.Module, client, cfg: FedSelectConfig, env, names: list[str] | None = None,
             keep_trace: bool = False) -> LTNResult:
    """GradLTN (Alg. 1) from the model's current state theta_0; the model ends in theta_0 or theta_L.

    Args:
        model: holds theta_0 on entry.
        client: whose train split is used.
        cfg: ``personalization_rate`` p, ``ltn_iterations`` L, ``ltn_epochs`` E, ``ranking``, ``start``.
        env: run context (learning rate schedule, generators).
        names: eligible parameters (default: ``eligible_names(model, cfg.scope)``).
        keep_trace: also return every iteration's mask and parameter change.
    """
    names = eligible_names(model, cfg.scope) if names is None else names
    theta0 = get_state(model)
    cand = filled(model, True, names)  # m_0: every eligible entry trains
    trace = [(cand, None)] if keep_trace else []

    def select(cand: Mask) -> Mask:
        # every iteration starts from theta_0 (rewind), so theta_i - theta_{i-1} is the move since theta_0
        now = dict(model.named_parameters())
        delta = {n: (now[n].detach().cpu() - theta0[n].cpu()).abs() for n in names}
        kept = keep_largest(delta, cand, cfg.personalization_rate, cfg.ranking)
        trace.extend([(kept, delta)] if keep_trace else [])
        set_state(model, theta0)
        return kept

    for i in range(cfg.ltn_iterations + 1):
        if i > 0:
            cand = select(cand)
        if i == cfg.ltn_iterations and cfg.start == "theta_0":
            break  # FedSelect returns theta_0: the last phase's training would be discarded
        masked_sgd(model, client, cand, cfg, env, cfg.ltn_epochs, ("ltn", i))
    return LTNResult(get_state(model), cand, trace)


def alt_schedule(epochs: int, unit: str = "pass") -> list[tuple[tuple, str]]:
    """LocalAlt's passes over the client's data, in order, as (generator key, part) pairs.

    ``unit="pass"`` (FedSelect sec. 3, every method's 5 local epochs): ``epochs`` passes in all,
    personal first and then alternating. ``unit="pair"`` (the authors' code): each epoch is a
    personal pass then a shared pass. The keys of ``"pair"`` are those pflkit always used.
    """
    one_of("alt_epoch", unit, ALT_EPOCHS)
    if unit == "pair":
        return [(("alt", e, part), part) for e in range(epochs) for part in ("personal", "shared")]
    return [(("alt", "pass", j), ("personal", "shared")[j % 2]) for j in range(epochs)]


def local_alt(model: nn.Module, client, personal: Mask, cfg: FLConfig, env) -> dict:
    """LocalAlt (sec. 2.3.2): full passes alternating between the personal and the shared entries.

    ``personal`` must cover every parameter (True = personal); ``cfg.alt_epoch`` and
    ``cfg.local_epochs`` give the passes (`alt_schedule`, module docstring). Returns the mean
    loss and the passes made on each part.
    """
    masks = {"personal": personal, "shared": {n: ~m for n, m in personal.items()}}
    filled_parts = [part for part, mask in masks.items() if any(bool(m.any()) for m in mask.values())]
    losses, passes = [], {"personal": 0, "shared": 0}
    for key, part in alt_schedule(cfg.local_epochs, cfg.alt_epoch):
        if cfg.alt_epoch == "pass" and len(filled_parts) == 1:
            part = filled_parts[0]  # nothing to alternate with: the pass goes to the only part
        stats = masked_sgd(model, client, masks[part], cfg, env, 1, key)
        if stats["samples"]:
            losses.append(stats["loss"])
            passes[part] += 1
    return {"loss": float(np.mean(losses)) if losses else math.nan, "passes": passes}


# ---------------------------------------------------------------------------------------------
# partial-model exchange: what travels, and the server of Alg. 2
# ---------------------------------------------------------------------------------------------


def _bits(mask: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.packbits(mask.detach().cpu().numpy().ravel()))


def encode_mask(mask: torch.Tensor) -> dict:
    """How a partial mask travels: packed bits (numel / 8 bytes) or, when cheaper, the int32
    flat positions of its False entries (4 bytes each)."""
    holes = (~mask).flatten().nonzero().flatten()
    if 4 * holes.numel() < (mask.numel() + 7) // 8:
        return {"holes": holes.to(torch.int32).cpu()}
    return {"bits": _bits(mask)}


def decode_mask(code: dict, shape) -> torch.Tensor:
    n = int(np.prod(shape))
    if "holes" in code:
        out = torch.ones(n, dtype=torch.bool, device="cpu")  # masks live on the host (`filled`)
        out[code["holes"].long()] = False
        return out.view(tuple(shape))
    return torch.from_numpy(np.unpackbits(code["bits"].numpy(), count=n).astype(bool)).view(tuple(shape))


def to_sparse(state: dict, travel: Mask, buffers: bool, masks: bool = True) -> dict:
    """The entries of ``state`` where ``travel`` is True (1-D per partially travelling tensor).

    A tensor entirely travelling goes whole, one not travelling at all is left out, and a
    partial one carries its `encode_mask` code unless ``masks=False`` (the receiver knows it).
    """
    values, codes = {}, {}
    for name, m in travel.items():
        if bool(m.all()):
            values[name] = state[name].clone()
        elif bool(m.any()):
            values[name] = state[name][m.to(state[name].device)].clone()
            if masks:
                codes[name] = encode_mask(m)
    out = {"values": values, "masks": codes}
    if buffers:
        out["buffers"] = {k: v.clone() for k, v in state.items() if k not in travel}
    return out


def travel_of(payload: dict, like: dict) -> Mask:
    """The travel mask a `to_sparse` payload encodes, over the parameters in ``like``."""
    return {name: decode_mask(payload["masks"][name], ref.shape) if name in payload["masks"]
            else torch.full(ref.shape, name in payload["values"], dtype=torch.bool, device="cpu")
            for name, ref in like.items()}


def _dense(payload: dict, name: str, fallback: torch.Tensor, travel: torch.Tensor) -> torch.Tensor:
    """One tensor of a payload made dense; entries that did not travel take ``fallback``."""
    if name not in payload["values"]:
        return fallback.clone()
    if bool(travel.all()):
        return payload["values"][name].clone()
    out = fallback.clone()
    out[travel.to(out.device)] = payload["values"][name].to(out.dtype)
    return out


def write_into(base: dict, payload: dict, travel: Mask) -> dict:
    """A copy of ``base`` with the payload's values written at the ``travel`` positions."""
    out = {k: v.clone() for k, v in base.items()}
    for name in payload["values"]:
        out[name] = _dense(payload, name, out[name], travel[name])
    out.update({k: v.clone() for k, v in payload.get("buffers", {}).items()})
    return out


def init(model, fed, cfg, env) -> dict:
    w = get_state(model)
    return {"weights": w, "global_mask": filled(model, False), "travel": {}}


def broadcast(state, client_id, cfg, env):
    """The full model on first contact, else the global values where the client shared last round."""
    bits = state["travel"].get(client_id)
    if bits is None:
        return {"full": state["weights"]}
    travel = {n: decode_mask({"bits": b}, state["weights"][n].shape) for n, b in bits.items()}
    return to_sparse(state["weights"], travel, buffers=cfg.bn_stats == "shared", masks=False)


def receive(msg, client_state) -> dict:
    """theta_k^{t-1}: the message's global values at the client's shared positions, its own elsewhere."""
    if "full" in msg:
        return {k: v.clone() for k, v in msg["full"].items()}
    return write_into(client_state["weights"], msg, client_state["travel"])


def aggregate(state, updates, cfg, env) -> dict:
    """Alg. 2: per-entry mean over the clients sharing it; m_G = OR of the client masks."""
    old = state["weights"]
    params = state["global_mask"]
    travels = [travel_of(u.payload, params) for u in updates]
    sizes = [u.num_samples for u in updates]
    new = dict(old)
    for name in params:
        dense = [_dense(u.payload, name, old[name], t[name]) for u, t in zip(updates, travels)]
        new[name] = masked_mean(dense, [t[name] for t in travels], sizes, fallback=old[name])
    with_buffers = [u for u in updates if "buffers" in u.payload]
    if with_buffers:
        new.update(weighted_mean([u.payload["buffers"] for u in with_buffers], [u.num_samples for u in with_buffers]))
    gmask = {n: torch.stack([~t[n] for t in travels]).any(0) for n in params}
    known = dict(state["travel"])
    # the server remembers each client's last mask (as bits) to send it only its shared entries
    known.update({u.client_id: {n: _bits(t[n]) for n in params} for u, t in zip(updates, travels)})
    return {**state, "weights": new, "global_mask": gmask, "travel": known}


def personalized_state(state, client_state, cfg) -> dict:
    """The client's model after Alg. 2's write-back: global values at its shared positions."""
    if client_state is None:
        return state["weights"]
    out = dict(client_state["weights"])
    for name, m in client_state["travel"].items():
        out[name] = torch.where(m.to(out[name].device), state["weights"][name], out[name])
    if cfg.bn_stats == "shared":
        out.update({k: v for k, v in state["weights"].items() if k not in client_state["travel"]})
    return out


def evaluate(state, client, client_state, cfg, env, split):
    model = set_state(env.scratch_model(), personalized_state(state, client_state, cfg))
    return evaluate_model(model, client, split, device=env.device)


def mask_report(state, fed, cfg, env, client_states) -> dict:
    """The clients' final personal masks compared (Fig. 1): per client its personal share, and
    ``mask_iou``, the mean over client pairs of |m_i AND m_j| / |m_i OR m_j| (1: every client keeps
    the same entries personal; None with fewer than two trained clients)."""
    ids = sorted(client_states)
    masks = [torch.cat([(~m).flatten().cpu() for m in client_states[j]["travel"].values()]) for j in ids]
    pairs = []
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            union = int((masks[a] | masks[b]).sum())
            pairs.append(1.0 if union == 0 else int((masks[a] & masks[b]).sum()) / union)
    share = {j: float(m.float().mean()) for j, m in zip(ids, masks)}
    out = {"personal_share": [share.get(j) for j in range(fed.num_clients)],
           "mask_iou": float(np.mean(pairs)) if pairs else None}
    if getattr(cfg, "report_head_iou", False):
        travel = client_states[ids[0]]["travel"] if ids else {}
        out.update(_head_iou(client_states, ids, [n for n in head_param_names(env.model_fn()) if n in travel]))
    return out


def _head_iou(client_states: dict, ids: list[int], head: list[str]) -> dict:
    """Fig. 1: ``head_mask_iou``, the (n, n) IoU of the trained clients' personal masks over the final linear
    layer's entries (rows and columns in client order, 1 on the diagonal, 4 decimals), and
    ``head_personal_share``, each client's personal share of those entries (the keys
    `pflkit.report.fedselect.figures.stored_head_iou` reads)."""
    masks = [torch.cat([(~client_states[j]["travel"][n]).flatten().cpu() for n in head]) for j in ids]
    iou = np.ones((len(ids), len(ids)))
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            union = int((masks[a] | masks[b]).sum())
            iou[a, b] = iou[b, a] = 1.0 if union == 0 else int((masks[a] & masks[b]).sum()) / union
    return {"head_mask_iou": np.round(iou, 4).tolist(),
            "head_personal_share": [round(float(m.float().mean()), 4) for m in masks]}


def finish_update(model, client, personal: Mask, loss: float, cfg) -> tuple[Update, dict]:
    """Package a client's round: payload of shared entries, client state, metrics."""
    weights = get_state(model)
    travel = {n: ~m for n, m in personal.items()}
    payload = to_sparse(weights, travel, buffers=cfg.bn_stats == "shared")
    total = sum(m.numel() for m in personal.values())
    share = sum(int(m.sum()) for m in personal.values()) / max(total, 1)
    return (Update(client.id, client.num("train"), payload, {"loss": loss, "personal_share": share}),
            {"weights": weights, "travel": travel})


def grow_mask(model: nn.Module, before: dict, personal: Mask, names: list[str], share: float, target: float,
              ranking: str = "global") -> Mask:
    """The authors' schedule: among the still-shared eligible entries, the ``share`` that moved most
    since ``before`` become personal, without passing ``target`` of the eligible entries."""
    total = sum(personal[n].numel() for n in names)
    mine = sum(int(personal[n].sum()) for n in names)
    k = min(int(round(share * (total - mine))), int(math.floor(target * total)) - mine)
    if k <= 0:
        return personal
    now = dict(model.named_parameters())
    delta = {n: (now[n].detach().cpu() - before[n].cpu()).abs() for n in names}
    join = keep_largest(delta, {n: ~personal[n] for n in names}, k / (total - mine), ranking)
    return {n: m | join[n] if n in join else m for n, m in personal.items()}


def _rounds_update(model, client, client_state, cfg, env):
    """``schedule="rounds"``: LocalAlt with last round's mask, then the mask grows."""
    names = eligible_names(model, cfg.scope)
    personal = filled(model, False) if client_state is None else {n: ~t for n, t in client_state["travel"].items()}
    before = get_state(model)
    stats = local_alt(model, client, personal, cfg, env)
    personal = grow_mask(model, before, personal, names, cfg.personalization_rate, cfg.target, cfg.ranking)
    return finish_update(model, client, personal, stats["loss"], cfg)


def client_update(msg, client, client_state, cfg, env):
    """Alg. 2, client side: GradLTN chooses the mask, LocalAlt trains, shared entries travel."""
    model = set_state(env.scratch_model(), receive(msg, client_state))
    if cfg.schedule == "rounds":
        return _rounds_update(model, client, client_state, cfg, env)
    ltn = grad_ltn(model, client, cfg, env)
    set_state(model, ltn.start)
    personal = {**filled(model, False), **ltn.mask}
    stats = local_alt(model, client, personal, cfg, env)
    return finish_update(model, client, personal, stats["loss"], cfg)


FEDSELECT = Algorithm(
    name="fedselect", label="FedSelect", config=FedSelectConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate,
    global_model=lambda state: state["weights"], report=mask_report,
    eval_view=lambda state, cid, cfg, env: {"weights": state["weights"]},  # not every client's mask
    vectorizable=True,
)

FEDSELECT_V2 = replace(FEDSELECT, name="fedselect_v2", label="FedSelectv2", config=FedSelectV2Config)
