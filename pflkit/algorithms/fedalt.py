"""FedAlt (Pillutla et al., 2022, "Federated learning with partial model personalization").

The model is split by layer into shared parameters u and personal parameters v_k,
fixed before training (FedSelect sec. 1: "require hand-selected partitioning ... choose
u as only the input or output layers"). Each round a sampled client runs LocalAlt, as in
FedSelect (`pflkit.algorithms.fedselect.local_alt`): full passes over its data that alternate
between updating v_k with u frozen and updating u with v_k frozen, v_k first; it sends u, the
server averages it by sample count and v_k stays on the client.

How many passes (``alt_epoch``, as FedSelect's): FedSelect fixes "the number of local epochs
across all methods to 5" (sec. 3), so by default (``"pass"``) ``local_epochs`` = 5 passes in
all: v, u, v, u, v. ``alt_epoch="pair"`` makes each epoch a v pass then a u pass (10 passes
for 5 epochs; the FedSelect authors' LocalAlt, and pflkit's behaviour before).

``split="head"`` (default) keeps the output layer personal (FedSelect's FedAlt row);
``split="input"`` keeps the first layer (the first module owning parameters) personal.
The server, the message format and evaluation are FedSelect's (`pflkit.algorithms.fedselect`)
with a mask that is whole tensors; BN running statistics follow ``bn_stats``.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from pflkit.algorithms.fedselect import ALT_EPOCHS, FEDSELECT, ExchangeConfig, filled, finish_update, local_alt, receive
from pflkit.config import one_of
from pflkit.fl.algorithm import replace
from pflkit.fl.train import set_state
from pflkit.models.introspect import head_param_names


@dataclass(frozen=True)
class FedAltConfig(ExchangeConfig):
    """Attributes: split (``"head"`` / ``"input"``), alt_epoch (``"pass"`` / ``"pair"``: what one of
    the ``local_epochs`` is; module docstring); bn_stats and the rest: FedSelect's `ExchangeConfig`."""

    method = "FedAlt"

    alt_epoch: str = "pass"
    split: str = "head"

    def __post_init__(self):
        super().__post_init__()
        one_of("split", self.split, {"head", "input"})
        one_of("alt_epoch", self.alt_epoch, ALT_EPOCHS)


def personal_names(model: nn.Module, split: str) -> list[str]:
    """The parameters of the personal layer: ``model.head`` or the first module with parameters."""
    one_of("split", split, {"head", "input"})
    if split == "head":
        return head_param_names(model)
    for prefix, module in model.named_modules():
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if own:
            return [f"{prefix}.{n}" if prefix else n for n in own]
    raise ValueError(f"{type(model).__name__} has no parameters")


def client_update(msg, client, client_state, cfg, env):
    model = set_state(env.scratch_model(), receive(msg, client_state))
    names = set(personal_names(model, cfg.split))
    personal = {n: m | (n in names) for n, m in filled(model, False).items()}
    stats = local_alt(model, client, personal, cfg, env)
    return finish_update(model, client, personal, stats["loss"], cfg)


FEDALT = replace(FEDSELECT, name="fedalt", label="FedAlt", config=FedAltConfig, client_update=client_update)
