"""Methods on a client group, with their own model options, from an earlier method's weights.

pFedHN Table 2 (sec. 5.2, App. B) trains each baseline per budget group with the Table 1 settings and
LG-FedAvg from its group's FedAvg model; the experiment file declares this (``clients``, ``model``,
``start_from``), `resolve` checks it up front and the runner trains it, so the table is a function of
``results.json`` (`pflkit.report.pfedhn.budget_table`).
"""
from __future__ import annotations

import copy
import dataclasses

import pytest

from pflkit.config import ConfigError
from pflkit.run.experiment_config import ClientGroup
from pflkit.run.experiments import resolve

GROUPS = ("S", "M", "L")
ROWS = {"FedAvg": None, "Per-FedAvg (HF)": "Per-FedAvg (HF)", "pFedMe": "pFedMe", "LG-FedAvg": "LG-FedAvg"}


def small(**methods) -> dict:
    """A digits experiment of 6 clients and an MLP, with the given methods (seconds to run)."""
    base = {"algorithm": "fedavg", "rounds": 2, "fraction": 0.5, "local_steps": 2, "batch_size": 16,
            "eval_every": 0, "keep_best": False}
    return {"experiment": {"name": "groups", "paper": "test"},
            "data": {"dataset": "digits", "scheme": "dirichlet", "num_clients": 6, "partition": {"alpha": 1.0},
                     "val_fraction": 0.0},
            "model": {"name": "mlp", "options": {"hidden": [16]}},
            "methods": {label: {**base, **m} for label, m in methods.items()}}


GROUPED = dict(
    everyone={},
    fedavg0={"clients": {"group": 0, "of": 2}, "model": {"hidden": 8}},
    lg0={"algorithm": "lgfedavg", "clients": {"group": 0, "of": 2}, "model": {"hidden": 8}, "start_from": "fedavg0"},
)


# ----------------------------------------------------------------------------- the experiment file


def test_method_settings_are_read_and_kept_only_when_set():
    cfg = resolve(small(**GROUPED), "cpu")
    every, fedavg0, lg0 = cfg.methods
    assert fedavg0.clients == ClientGroup(0, 2) and fedavg0.model == {"hidden": 8} and lg0.start_from == "fedavg0"
    assert ClientGroup(1, 3).ids(6) == [2, 3] and ClientGroup(0, 3).ids(75) == list(range(25))
    stages = {m["label"]: m for m in cfg.to_dict()["methods"]}
    assert not {"clients", "model", "start_from"} & set(stages["everyone"])  # old runs keep their fingerprints
    assert stages["lg0"]["clients"] == {"group": 0, "of": 2} and stages["lg0"]["start_from"] == "fedavg0"
    for name in ("pfedhn_table1_c10_n50", "demo", "pfedvem_omniglot_n50"):
        assert all(not {"clients", "model", "start_from"} & set(m) for m in resolve(name, "cpu").to_dict()["methods"])


@pytest.mark.parametrize("change, key", [
    ({"fedavg0": {"clients": {"group": 2, "of": 2}}}, r"methods\.fedavg0\.clients\.group=2"),
    ({"fedavg0": {"clients": {"group": 0}}}, r"methods\.fedavg0\.clients="),
    ({"fedavg0": {"clients": {"group": 0, "of": 7}}}, r"methods\.fedavg0\.clients\.of=7.*more groups than clients"),
    ({"fedavg0": {"model": {"width": 8}}}, r"methods\.fedavg0\.model\.width=8.*not an option of model 'mlp'"),
    ({"fedavg0": {"model": 8}}, r"methods\.fedavg0\.model=8"),
    ({"lg0": {"start_from": "nobody"}}, r"methods\.lg0\.start_from='nobody'.*earlier"),
    ({"lg0": {"clients": {"group": 1, "of": 2}}}, r"methods\.lg0\.start_from='fedavg0'.*same clients"),
    ({"lg0": {"start_from": ""}}, r"methods\.lg0=.*no \[pretrain\] stage"),
])
def test_bad_method_settings_are_one_line_errors_naming_the_key(change, key):
    raw = small(**copy.deepcopy(GROUPED))
    for label, settings in change.items():
        raw["methods"][label].update(settings)
    with pytest.raises(ConfigError, match=key) as err:
        resolve(raw, "cpu")
    assert "\n" not in str(err.value)


def test_start_from_needs_an_earlier_method_with_a_global_model():
    raw = small(first=GROUPED["lg0"] | {"start_from": "later"}, later={})
    with pytest.raises(ConfigError, match=r"methods\.first\.start_from='later'.*earlier"):
        resolve(raw, "cpu")
    raw = small(lgfirst={"algorithm": "lgfedavg", "start_from": ""}, lg={})
    raw["methods"]["lg"] = {**raw["methods"]["lgfirst"], "start_from": "lgfirst"}
    raw["methods"]["lgfirst"]["start_from"] = ""
    raw["pretrain"] = {"algorithm": "fedavg", "rounds": 1}
    with pytest.raises(ConfigError, match=r"methods\.lg\.start_from='lgfirst'.*no global model"):
        resolve(raw, "cpu")


def test_a_client_group_cannot_have_unseen_clients():
    raw = small(**GROUPED)
    raw["data"]["unseen_clients"] = 1
    with pytest.raises(ConfigError, match=r"methods\.fedavg0\.clients=.*unseen_clients"):
        resolve(raw, "cpu")


@pytest.mark.parametrize("name, table1", [("pfedhn_table2_budget_c10", "pfedhn_table1_c10_n50"),
                                          ("pfedhn_table2_budget_c100", "pfedhn_table1_c100_n50")])
@pytest.mark.parametrize("preset", ["cpu", "paper"])
def test_table2_baselines_have_table1_settings_per_group(name, table1, preset):
    """App. B: the baselines use "the same hyperparameters selected in Section 5.1"; 5 clients per round of
    a group's 25 (the fraction is the only change); widths 8 / 16 / 32; LG-FedAvg from its group's FedAvg."""
    cfg, ref = resolve(name, preset), resolve(table1, preset)
    ref_stages = {m.label: m for m in ref.methods} | {"FedAvg": ref.pretrain}
    methods = {m.label: m for m in cfg.methods}
    assert set(methods) == {"pFedHN"} | {f"{r} ({g})" for r in ROWS for g in GROUPS}
    assert methods["pFedHN"].clients is None and methods["pFedHN"].config.budget_widths == (8, 16, 32)
    for g, (group, width) in enumerate(zip(GROUPS, (8, 16, 32))):
        for row in ROWS:
            m = methods[f"{row} ({group})"]
            assert m.clients == ClientGroup(g, 3) and m.model == {"width": width}
            assert m.clients.ids(cfg.data.num_clients) == list(range(25 * g, 25 * g + 25))
            want = dataclasses.replace(ref_stages[row].config, fraction=0.2)
            assert (m.algorithm, m.config) == (ref_stages[row].algorithm, want), m.label
            assert m.start_from == (f"FedAvg ({group})" if row == "LG-FedAvg" else "")
    assert ref.pretrain.config.fraction * ref.data.num_clients == 0.2 * 25  # 5 clients per round, both tables


@pytest.mark.parametrize("name", ["pfedhn_table2_budget_c10", "pfedhn_table2_budget_c100"])
def test_table2_published_numbers_agree(name):
    cfg = resolve(name, "cpu")
    groups = cfg.published_detail["groups"]
    for row, values in groups.items():
        if row == "pFedHN":
            assert cfg.published["pFedHN"] == pytest.approx(sum(values) / 3, abs=0.01)
            continue
        assert [cfg.published[f"{row} ({g})"] for g in GROUPS] == values


def test_table2_presets_change_sizes_only():
    """smoke / paper change rounds, steps and client counts, never a method's group, model or start."""
    cpu = {m.label: m for m in resolve("pfedhn_table2_budget_c10", "cpu").methods}
    for preset in ("smoke", "paper"):
        for m in resolve("pfedhn_table2_budget_c10", preset).methods:
            assert (m.algorithm, m.clients, m.model, m.start_from) == (
                cpu[m.label].algorithm, cpu[m.label].clients, cpu[m.label].model, cpu[m.label].start_from)
            assert m.config.fraction == cpu[m.label].config.fraction


def test_reproduce_plans_table2_with_its_baselines(tmp_path):
    from pflkit.batch.selection import plan, select

    chosen = select("pfedhn", "pfedhn_table2_*")
    assert set(chosen) == {"pfedhn_table2_budget_c10", "pfedhn_table2_budget_c100"}
    for preset in ("smoke", "cpu", "paper"):
        outcomes, todo = plan(preset, chosen, tmp_path, [], None, False)
        assert not outcomes and len(todo) == 2
        assert all(len(cfg.methods) == 13 for cfg, _ in todo)


# ----------------------------------------------------------------------------- the run


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    from pflkit.run.runner import run_experiment

    out = tmp_path_factory.mktemp("grouped")
    cfg = resolve(small(**GROUPED), "cpu")
    return cfg, out, run_experiment(cfg, out, progress=False)


def test_a_grouped_method_is_the_method_trained_on_its_group(grouped_run):
    """The runner's per-group stage gives exactly what training that method on the group's own federation
    (`Federation.subset`, the group's model) gives; LG-FedAvg starts from that FedAvg's weights."""
    from pflkit.data.datasets import load_dataset
    from pflkit.fl.federation import Federation
    from pflkit.fl.train import set_state
    from pflkit.run.environment import initial_model, make_env
    from pflkit.run.stages import method_setting
    from pflkit.run.stages import train_method

    cfg, out, results = grouped_run
    assert results["status"] == "ok"
    fedavg0, lg0 = results["methods"]["fedavg0"], results["methods"]["lg0"]
    assert fedavg0["clients"] == lg0["clients"] == [0, 1, 2] and "clients" not in results["methods"]["everyone"]
    assert [len(p) for p in fedavg0["per_client"]] == [3] and len(results["methods"]["everyone"]["per_client"][0]) == 6
    fed = Federation.load(out / "seed0" / "federation.npz", load_dataset("digits"))
    sub, exp = method_setting(cfg, cfg.methods[1], fed)
    assert sub.num_clients == 3 and sub.recipe["subset"] == [0, 1, 2] and exp.model.options == {"hidden": 8}
    assert [c.splits["test"].tolist() for c in sub.clients] == [
        c.splits["test"].tolist() for c in fed.subset([0, 1, 2]).clients]
    env = make_env(exp, sub, 0)
    by_hand = train_method(exp, "fedavg0", sub, env)
    assert [100 * by_hand.per_client[i]["acc"] for i in range(3)] == pytest.approx(fedavg0["per_client"][0])
    start = set_state(initial_model(env), by_hand.state["weights"])
    lg = train_method(exp, "lg0", sub, env, model=start)
    assert [100 * lg.per_client[i]["acc"] for i in range(3)] == pytest.approx(lg0["per_client"][0])
    assert fedavg0["acc_mean"] == pytest.approx(sum(fedavg0["per_client"][0]) / 3)


def test_the_whole_federation_methods_are_unchanged_by_grouped_ones(grouped_run, tmp_path):
    from pflkit.run.runner import run_experiment

    cfg, _, results = grouped_run
    alone = run_experiment(resolve(small(everyone={}), "cpu"), tmp_path, progress=False)
    assert alone["methods"]["everyone"]["per_client"] == results["methods"]["everyone"]["per_client"]


def test_group_settings_are_part_of_the_fingerprint():
    from pflkit.data.datasets import load_dataset
    from pflkit.run.folder import fingerprint, fingerprint_hash

    ds = load_dataset("digits")
    raw = small(**copy.deepcopy(GROUPED))
    base = fingerprint_hash(fingerprint(resolve(raw, "cpu"), ds))
    for label, key, value in (("fedavg0", "clients", {"group": 1, "of": 2}), ("fedavg0", "model", {"hidden": 4})):
        changed = copy.deepcopy(raw)
        changed["methods"][label][key] = value
        changed["methods"]["lg0"][key] = value
        assert fingerprint_hash(fingerprint(resolve(changed, "cpu"), ds)) != base, key


def test_the_flower_engine_refuses_grouped_methods(tmp_path):
    from pflkit.flower.serve import flower_trainer
    from pflkit.run.runner import run_experiment

    with pytest.raises(ConfigError, match=r"methods\.fedavg0: the flower engine cannot"):
        run_experiment(resolve(small(**GROUPED), "cpu"), tmp_path, trainer=flower_trainer(None), progress=False)


# ----------------------------------------------------------------------------- the stand-in


def test_the_budget_standin_carries_widths_to_mlp_hidden_units(tmp_path):
    from pflkit.notebooks.session import setup
    from pflkit.notebooks.standins import budget_standin

    assert budget_standin(resolve("pfedhn_table1_c10_n50", "smoke")) == []
    s = setup("smoke", str(tmp_path), standin=True, threads=1)
    cfg = s.resolve("pfedhn_table2_budget_c10")
    assert (cfg.data.dataset, cfg.model.name, cfg.model.options) == ("digits", "mlp", {})
    methods = {m.label: m for m in cfg.methods}
    assert (methods["pFedHN"].config.budget_model, methods["pFedHN"].config.budget_option) == ("mlp", "hidden")
    assert [methods[f"pFedMe ({g})"].model for g in GROUPS] == [{"hidden": 8}, {"hidden": 16}, {"hidden": 32}]
