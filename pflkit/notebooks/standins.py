"""The stand-in datasets of a notebook session (``setup(..., standin=True)``): the overrides that run an
experiment on the embedded sklearn digits when its own dataset may be missing offline, its partition and any
model-size budgets carried over to what digits can hold.
"""
from __future__ import annotations

from pflkit.data.datasets import DATASET_NAMES

# Every dataset but digits is replaced by the embedded sklearn digits with its small BN conv net, pooled and
# re-split by the experiment's partition.
STANDIN_DATASET = "digits"
_STANDIN_BASE = ("data.dataset=digits", "data.options={}", "model.name=digits_cnn", "model.options={}",
                 "data.augment=none", "data.task=label", "data.split=pool")
STANDINS: dict[str, tuple[str, ...]] = {name: _STANDIN_BASE for name in DATASET_NAMES if name != STANDIN_DATASET}
# Partitions that need per-sample groups (domains, speakers) or superclasses, which digits lacks,
# become Dirichlet label shift.
GROUP_SCHEMES = {"domains", "natural", "concept_drift"}
GROUP_SCHEME_STANDIN = ("data.scheme=dirichlet", "data.partition={ alpha = 0.5 }")
# Experiments whose budgets are sizes of one network (pFedHN Table 2: LeNet widths 8 / 16 / 32) keep them on
# the stand-in as the hidden units of an MLP: digits' 8x8 images are too small for a LeNet.
BUDGET_STANDIN = ("mlp", "hidden")


def budget_standin(cfg, model: str = BUDGET_STANDIN[0], option: str = BUDGET_STANDIN[1]) -> list[str]:
    """Overrides that carry an experiment's budget sizes to ``model``'s ``option`` (none if it has no budgets).

    A budget is pFedHN's ``budget_widths`` (its ``budget_model`` / ``budget_option`` become ``model`` /
    ``option``) or a method's own ``model = { width = w }`` (it becomes ``{ option = w }``).
    """
    out = []
    for m in cfg.methods:
        if getattr(m.config, "budget_widths", ()):
            out += [f'methods."{m.label}".budget_model={model}', f'methods."{m.label}".budget_option={option}']
        sizes = getattr(m, "model", None) or {}
        if len(sizes) > 1:
            raise ValueError(f"methods.{m.label}.model={sizes}: a budget stand-in needs one size option")
        out += [f'methods."{m.label}".model={{ {option} = {v} }}' for v in sizes.values()]
    return [f"model.name={model}", "model.options={}", *out] if out else []


def standin_overrides(cfg) -> list[str]:
    """The overrides that run the resolved experiment ``cfg`` on the stand-in (none when its dataset is digits):
    the digits data and model, Dirichlet label shift for a partition digits cannot make, its budgets."""
    if cfg.data.dataset not in STANDINS:
        return []
    extra = GROUP_SCHEME_STANDIN if cfg.data.scheme in GROUP_SCHEMES else ()
    return [*STANDINS[cfg.data.dataset], *extra, *budget_standin(cfg)]
