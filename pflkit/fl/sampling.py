"""Who takes part in a round: client sampling and the participation protocol.

Two rules pick clients, both drawn from (seed, round) so a resumed run draws the same ones:

* the round's clients (FedL2P Alg. 1 line 3; pFedMe's Bernoulli protocol): `sample_clients`
  under the config's `SamplingRule` (``sampling``, ``fraction``);
* under ``participation = "broadcast"`` (pFedVEM sec. 3.1, after pFedMe Alg. 1; pFedVEM's
  Alg. 1 lines 2-8) the server broadcasts to every client (``fraction = 1``), every client
  runs its local update, and each reports with probability ``report_fraction``: the
  `reporters` are `sample_clients` under ``SamplingRule("bernoulli", report_fraction)``, so
  with one seed they are the very clients ``"sampled"`` with ``sampling="bernoulli",
  fraction=report_fraction`` would train.

The protocol travels in the message: `flag` wraps what ``broadcast`` made as ``{"msg": msg,
"report": bool}`` and `unflag` unwraps it on the client. `pflkit.fl.algorithm.Algorithm.send` /
``respond`` apply them around every algorithm's ``broadcast`` / ``client_update``, so these
receive plain messages whichever protocol runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pflkit.config import fraction as check_fraction
from pflkit.config import one_of, require

SAMPLING = ("fraction", "bernoulli")
PARTICIPATION = ("sampled", "broadcast")


@dataclass(frozen=True)
class SamplingRule:
    """How a round's clients are drawn from those that may take part.

    ``kind="fraction"``: max(1, round(fraction * C)) clients without replacement;
    ``kind="bernoulli"``: each client independently with probability ``fraction`` (redrawn if none).
    """

    kind: str
    fraction: float

    def __post_init__(self):
        one_of("sampling", self.kind, set(SAMPLING))
        check_fraction("fraction", self.fraction)

    @classmethod
    def of(cls, cfg) -> SamplingRule:
        """The round's rule of a config (its ``sampling`` and ``fraction``)."""
        return cls(cfg.sampling, cfg.fraction)


def sample_clients(clients: int | list[int], rule: SamplingRule, env, round_index: int) -> list[int]:
    """Clients taking part in a round under ``rule``, drawn from ``env.generator("sample", round_index)``.

    ``clients``: the ids that may take part (or their count C, meaning 0..C-1).
    """
    ids = list(range(clients)) if isinstance(clients, int) else list(clients)
    n = len(ids)
    gen = env.generator("sample", round_index)
    if rule.kind == "fraction":
        k = max(1, int(round(rule.fraction * n)))
        return sorted(ids[i] for i in torch.randperm(n, generator=gen, device="cpu")[:k].tolist())
    while True:
        picked = (torch.rand(n, generator=gen, device="cpu") < rule.fraction).nonzero().flatten().tolist()
        if picked:
            return [ids[i] for i in picked]


def eval_clients(clients: int | list[int], cfg, env) -> list[int]:
    """The clients of every validation pass: all (seen) clients, or a fixed random subset of ``eval_clients``."""
    ids = list(range(clients)) if isinstance(clients, int) else list(clients)
    if cfg.eval_clients == 0 or cfg.eval_clients >= len(ids):
        return ids
    gen = env.generator("eval-clients")
    return sorted(ids[i] for i in torch.randperm(len(ids), generator=gen, device="cpu")[: cfg.eval_clients].tolist())


# ---------------------------------------------------------------- participation protocol


def check_participation(cfg) -> None:
    """Validate ``participation`` and ``report_fraction`` of a config (one-line errors naming the key)."""
    one_of("participation", cfg.participation, set(PARTICIPATION))
    r = cfg.report_fraction
    require(isinstance(r, (int, float)) and 0 <= r <= 1, "report_fraction", r, "must be in [0, 1]")
    if cfg.participation == "broadcast":
        require(r > 0, "report_fraction", r, "participation='broadcast' needs a reporting probability > 0")
        require(cfg.fraction == 1 and cfg.sampling == "fraction", "fraction", cfg.fraction,
                "participation='broadcast' hands every client the broadcast: use fraction=1 and "
                "sampling='fraction' (report_fraction draws who reports)")


def broadcasting(cfg) -> bool:
    """Whether ``cfg`` runs the broadcast protocol (configs without the field: no)."""
    return getattr(cfg, "participation", "sampled") == "broadcast"


def roster(fed, cfg) -> dict:
    """Server-state entry of the broadcast protocol: the client ids the reporters are drawn from."""
    return {"ids": [int(i) for i in fed.seen_ids]} if broadcasting(cfg) else {}


def reporters(ids, cfg, env) -> list[int]:
    """The clients that report in round ``env.round`` of the broadcast protocol: each with probability
    ``report_fraction``, redrawn if nobody is drawn (the round's Bernoulli sampling, same (seed, round) key)."""
    return sample_clients(list(ids), SamplingRule("bernoulli", cfg.report_fraction), env, env.round)


def flag(msg, state, client_id, cfg, env):
    """The broadcast message; under ``"broadcast"`` wrapped as ``{"msg": msg, "report": bool}``."""
    if not broadcasting(cfg):
        return msg
    return {"msg": msg, "report": client_id in reporters(state["ids"], cfg, env)}


def unflag(msg, cfg) -> tuple[Any, bool]:
    """(message, does this client report) from what `flag` sent."""
    return (msg["msg"], bool(msg["report"])) if broadcasting(cfg) else (msg, True)


def reported(updates: list) -> list:
    """The updates that carry a report (non-reporting clients send ``payload=None``)."""
    return [u for u in updates if u.payload is not None]
