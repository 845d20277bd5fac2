"""What the Flower adapter needs to know per algorithm beyond its five phases.

Training needs nothing extra: the server sends ``algo.broadcast(state, cid, ...)``,
the client runs ``algo.client_update``, the server runs ``algo.aggregate``. Only
evaluation differs from the single-process loop: there ``algo.evaluate`` reads the
whole server state, which on Flower lives on the server while the data lives on the
client. An `EvalSpec` says what part of the state travels for an evaluation
(``view``) and how the client evaluates with it (``evaluate``, same signature as
``algo.evaluate`` with the view in place of the state). The default sends the whole
state, right for FedAvg (the global weights), FedL2P (theta_g, sent once thanks to the
message cache, and lambda) and pFedVEM (base and w). The exceptions:

* pFedHN / pFedHN-PC: the hypernetwork never leaves the server; a client is evaluated
  with its generated weights theta_i = h(v_i; phi) (the same message as in training);
* FedSelect: only the global weights (not the server's record of every client's mask).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pflkit.fl.algorithm import Algorithm


@dataclass(frozen=True)
class EvalSpec:
    """``view(state, cid, cfg, env) -> obj`` travels; ``evaluate(obj, client, client_state, cfg, env, split)``."""

    view: Callable
    evaluate: Callable


def _whole_state(state, cid, cfg, env):
    return state


def _pfedhn_evaluate(view, client, client_state, cfg, env, split):
    from pflkit.algorithms import pfedhn
    from pflkit.fl.train import evaluate_model

    # the same target network `pfedhn.personal_model` builds, from the theta that travelled
    model = pfedhn.client_model(view["theta"], view["width"], client, client_state, cfg, env)
    return evaluate_model(model, client, split, device=env.device)


def _pfedhn_view(state, cid, cfg, env):
    from pflkit.algorithms import pfedhn

    return pfedhn.broadcast(state, cid, cfg, env)


def _fedselect_view(state, cid, cfg, env):
    return {"weights": state["weights"]}


SPECS: dict[str, EvalSpec] = {
    "pfedhn": EvalSpec(_pfedhn_view, _pfedhn_evaluate),
    "pfedhn_pc": EvalSpec(_pfedhn_view, _pfedhn_evaluate),
    "fedselect": EvalSpec(_fedselect_view, None),
    "fedselect_v2": EvalSpec(_fedselect_view, None),
}


def eval_spec(algo: Algorithm) -> EvalSpec:
    """The algorithm's evaluation split between server and client (default: the whole state)."""
    spec = SPECS.get(algo.name, EvalSpec(_whole_state, None))
    return EvalSpec(spec.view, spec.evaluate or algo.evaluate)
