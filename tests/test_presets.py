"""A preset changes sizes only: every other difference from `paper` is declared (DESIGN.md, "Presets").

For every experiment file and every stage (pretraining and methods), the `smoke` and `cpu`
presets are resolved and compared setting by setting with `paper`, which stands for the paper's
settings. A difference in a SIZE (below) is what a preset is for; any other difference must be
declared in the table of the preset that has it, ``deviations = ["pretrain.lr", ...]``, and a
declaration that covers no such difference is stale. Both fail here with the experiment,
the preset, the key and the two values.
"""
from __future__ import annotations

import sys

import pytest

from pflkit.config import ConfigError, to_dict
from pflkit.run.experiments import _split_key, list_experiments, resolve
from pflkit.report.tables import format_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# --- SIZES: the settings a preset may change without declaring it --------------------------------
# A size scales the compute or the amount of data while the update rule, its hyperparameters and
# the data's distribution stay the paper's. Anything else (learning rates, momentum, schedules,
# batch size, the fraction of clients per round, initial values, the train / test split, the
# Dirichlet concentration, ...) changes the optimization or the task and must be declared.

# Fields of a stage's config (pretrain.FIELD, methods."LABEL".FIELD):
STAGE_SIZES = frozenset({
    # training length: rounds (server steps), local passes or steps, fine-tuning epochs; these
    # stop the same update rule earlier
    "rounds", "local_epochs", "local_steps", "epochs", "head_epochs", "finetune_epochs",
    # iteration counts of an inner solve, also a budget of the same rule: FedL2P's K meta
    # iterations, pFedMe's inner steps, pFedVEM's head steps, FedSelect's epochs per GradLTN
    # iteration (NOT ltn_iterations: L sets the personal share, about p^L of the entries)
    "meta_iters", "inner_steps", "head_steps", "ltn_epochs",
    # pFedHN's novel-client fit: the most updates of v_new and the old fixed budget (sec. 5.3)
    "novel_max_steps", "novel_rounds",
    # bookkeeping: how often and on how many clients progress is measured and saved
    "eval_every", "eval_clients", "checkpoint_every",
})

# Settings outside the stages, as dotted keys:
OTHER_SIZES = frozenset({
    "seed", "seeds",                                   # which and how many repetitions
    "data.num_clients", "data.unseen_clients",          # size of the federation
    # how much of a dataset is read, or at what resolution: samples per domain / corruption,
    # image side, mel bands, clip length, Omniglot's background set or all 50 alphabets
    "data.options.per_domain", "data.options.per_corruption", "data.options.size",
    "data.options.n_mels", "data.options.duration", "data.options.sets",
    "data.partition.samples_per_class", "data.partition.samples_per_client",  # samples per client
    # the model: DESIGN.md's presets run "tiny" / "reduced models"; a stand-in architecture and
    # its width are sizes. `bn` only comes with the stand-in LeNet, giving it the BatchNorm layers
    # of the paper's ResNet-18 (FedL2P works on BN statistics). `pretrained` weights are NOT a size.
    "model.name", "model.options.width", "model.options.channels", "model.options.hidden",
    "model.options.bn",
})

REFERENCE = "paper"
SCALED = ("smoke", "cpu")
MISSING = "<unset>"


def _leaves(tree, prefix: tuple = ()) -> dict[tuple, object]:
    """Nested dicts -> {key path: value}; lists and empty dicts are leaves' values / nothing."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_leaves(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def settings(cfg) -> dict[tuple, object]:
    """Every setting of a resolved experiment, by key path (``("methods", LABEL, "lr")``)."""
    tree = {"seed": cfg.seed, "seeds": cfg.seeds, "data": to_dict(cfg.data), "model": to_dict(cfg.model)}
    if cfg.pretrain is not None:  # with the stage's own data, new_head, weights (PretrainStage)
        tree["pretrain"] = {"algorithm": cfg.pretrain.algorithm, **to_dict(cfg.pretrain.config),
                            **cfg.pretrain.extra_dict()}
    tree["methods"] = {m.label: {"algorithm": m.algorithm, **to_dict(m.config)} for m in cfg.methods}
    return _leaves(tree)


def is_size(path: tuple) -> bool:
    if path[:2] == ("pretrain", "data"):  # the pretraining stage's own data: the sizes of [data]
        return ".".join(("data",) + path[2:]) in OTHER_SIZES
    if path[0] == "pretrain":
        return path[1] in STAGE_SIZES
    if path[0] == "methods":
        return path[2] in STAGE_SIZES
    return ".".join(path) in OTHER_SIZES


def covers(declared: tuple, path: tuple) -> bool:
    """``methods.*.lr`` covers every method's lr; a table (``model.options``) covers its entries; a stage's
    ``algorithm`` covers all of that stage's settings (another algorithm's cannot be compared one by one)."""
    stage = 2 if declared[:1] == ("methods",) else 1
    if len(declared) == stage + 1 and declared[-1] == "algorithm" and path[:stage] == declared[:stage]:
        return True
    if len(declared) > len(path):
        return False
    return all(d == p or (i == 1 and d == "*" and declared[0] == "methods")
               for i, (d, p) in enumerate(zip(declared, path)))


def show(path: tuple) -> str:
    return ".".join(f'"{p}"' if i == 1 and path[0] == "methods" else p for i, p in enumerate(path))


def declared_in(path, preset: str) -> list[str]:
    with open(path, "rb") as f:
        return tomllib.load(f).get("presets", {}).get(preset, {}).get("deviations", [])


def audit(name: str, path) -> list[str]:
    """Every problem of one experiment file: undeclared algorithm differences, stale declarations."""
    problems = [f"{name} [presets.{REFERENCE}]: declares deviations {d!r}; the paper preset is the reference"
                for d in declared_in(path, REFERENCE)]
    ref = settings(resolve(path, REFERENCE))
    for preset in SCALED:
        cfg = resolve(path, preset)
        mine = settings(cfg)
        diffs = {k: (mine.get(k, MISSING), ref.get(k, MISSING)) for k in set(mine) | set(ref)
                 if mine.get(k, MISSING) != ref.get(k, MISSING) and not is_size(k)}
        declared = declared_in(path, preset)
        assert len(cfg.deviations) == len(declared) and all(
            c.startswith(f"{d}=") for c, d in zip(cfg.deviations, declared)), f"{name}: declarations not carried"
        parsed = [tuple(_split_key(d)) for d in declared]
        for key, (here, there) in sorted(diffs.items(), key=lambda kv: show(kv[0])):
            if not any(covers(d, key) for d in parsed):
                problems.append(f"{name} [presets.{preset}]: undeclared {show(key)} = {here!r} "
                                f"({REFERENCE}: {there!r})")
        for text, d in zip(declared, parsed):
            if not any(covers(d, key) for key in diffs):
                problems.append(f"{name} [presets.{preset}]: stale declaration {text!r}: not a difference "
                                f"from {REFERENCE} outside the sizes")
    return problems


EXPERIMENTS = list_experiments()


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_presets_change_sizes_only_or_declare_it(name):
    problems = audit(name, EXPERIMENTS[name])
    assert not problems, "\n".join(problems)


# --- the mechanism ----------------------------------------------------------------------------------

def _spec(deviations, preset="cpu") -> dict:
    return {"data": {"dataset": "digits", "num_clients": 4},
            "pretrain": {"algorithm": "fedavg", "lr": 0.05, "momentum": 0.9},
            "methods": {"FT (BN C)": {"algorithm": "finetune", "bn": "client", "lr": 0.01},
                        "FT (BN G)": {"algorithm": "finetune", "bn": "global", "lr": 0.02}},
            "presets": {preset: {"deviations": deviations, "pretrain.rounds": 2}}}


def test_declared_deviations_are_carried_with_their_values():
    cfg = resolve(_spec(["pretrain.momentum", 'methods."FT (BN C)".lr', "methods.*.bn", "methods.*.lr"]), "cpu")
    assert cfg.pretrain.config.rounds == 2  # the other entries of the table still apply
    assert cfg.deviations == ("pretrain.momentum=0.9", 'methods."FT (BN C)".lr=0.01',
                              "methods.*.bn={'FT (BN C)': 'client', 'FT (BN G)': 'global'}",
                              "methods.*.lr={'FT (BN C)': 0.01, 'FT (BN G)': 0.02}")
    assert cfg.to_dict()["deviations"] == list(cfg.deviations)
    assert resolve(_spec(["pretrain.momentum"]), "smoke").deviations == ()  # another preset's table


@pytest.mark.parametrize("key", ["pretrain.nesterov", "methods.*.nope", 'methods."FT (BN I)".lr', "data",
                                 "methods", "title", "deviations"])
def test_a_declared_key_that_is_no_setting_is_an_error_naming_it(key):
    with pytest.raises(ConfigError, match="deviations") as err:
        resolve(_spec([key]), "cpu")
    assert key in str(err.value) and "\n" not in str(err.value)


def test_deviations_must_be_a_list_and_are_not_an_override():
    with pytest.raises(ConfigError, match="deviations"):
        resolve(_spec("pretrain.lr"), "cpu")
    with pytest.raises(ConfigError, match="deviations"):
        resolve("demo", "cpu", ['deviations=["pretrain.lr"]'])


def test_the_table_lists_the_deviations_only_when_there_are_any():
    res = {"config": {"name": "x", "preset": "cpu", "title": "t",
                      "deviations": ["pretrain.momentum=0.9", "pretrain.lr=0.05"]},
           "methods": {"Global": {"acc_mean": 50.0, "acc_std": 1.0, "per_seed": [50.0], "status": "ok"}}}
    text = format_table(res)
    assert text.splitlines()[-1] == ("deviations from the paper's settings at preset cpu: "
                                     "pretrain.momentum=0.9, pretrain.lr=0.05")
    res["config"]["deviations"] = []
    assert "deviations" not in format_table(res)
    del res["config"]["deviations"]  # results.json written before deviations were recorded
    assert "deviations" not in format_table(res)


def test_the_audit_catches_an_undeclared_and_a_stale_setting(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('[data]\ndataset = "digits"\nnum_clients = 4\n'
                    '[pretrain]\nalgorithm = "fedavg"\nlr = 0.05\nmomentum = 0.9\nbatch_size = 16\n'
                    '[presets.cpu]\ndeviations = ["pretrain.batch_size"]\n'
                    '[presets.paper]\n"pretrain.momentum" = 0.0\n"pretrain.rounds" = 500\n"data.num_clients" = 100\n')
    problems = audit("x", path)
    assert any("[presets.cpu]: undeclared pretrain.momentum = 0.9 (paper: 0.0)" in p for p in problems)
    assert any("[presets.smoke]: undeclared pretrain.momentum" in p for p in problems)
    assert any("stale declaration 'pretrain.batch_size'" in p for p in problems)
    assert not any("rounds" in p or "num_clients" in p for p in problems)  # sizes


def test_the_audit_reads_the_pretraining_data_and_a_stage_of_another_algorithm(tmp_path):
    path = tmp_path / "y.toml"
    base = ('[data]\ndataset = "digits"\nnum_clients = 4\n'
            '[pretrain]\nalgorithm = "fedavg"\nlr = 0.05\nnew_head = true\n'
            '[pretrain.data]\ndataset = "digits"\nnum_clients = 2\npartition = { alpha = 1.0 }\n'
            '[methods."FT"]\nalgorithm = "finetune"\n')
    path.write_text(base + '[presets.paper]\n"pretrain.data.num_clients" = 20\n'
                    '"pretrain.data.partition" = { alpha = 5.0 }\n')
    problems = audit("y", path)
    assert any("[presets.cpu]: undeclared pretrain.data.partition.alpha = 1.0 (paper: 5.0)" in p for p in problems)
    assert not any("num_clients" in p for p in problems)  # the pretraining data's size, like data.num_clients
    # `paper` replaces the stage by one that trains nothing: its declared algorithm covers the stage's settings
    declared = '"pretrain.algorithm", "pretrain.data.dataset"'
    path.write_text(base.replace('[methods."FT"]', f'[presets.cpu]\ndeviations = [{declared}]\n'
                                 f'[presets.smoke]\ndeviations = [{declared}]\n[methods."FT"]')
                    + '[presets.paper]\n"pretrain" = { algorithm = "none", new_head = true }\n')
    assert audit("y", path) == []
    path.write_text(base + '[presets.paper]\n"pretrain" = { algorithm = "none", new_head = true }\n')
    assert any("[presets.cpu]: undeclared pretrain.algorithm = 'fedavg' (paper: 'none')" in p for p in audit("y", path))
