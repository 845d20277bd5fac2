from pathlib import Path

import pytest

from pflkit.config import ConfigError
from pflkit.run.experiments import list_experiments, resolve


def test_every_experiment_file_resolves_at_every_preset():
    exps = list_experiments()
    assert "demo" in exps
    for name, path in exps.items():
        for preset in ("smoke", "cpu", "paper"):
            cfg = resolve(path, preset)
            assert cfg.name == name and cfg.preset == preset


def test_presets_change_sizes_only():
    cpu, smoke = resolve("demo", "cpu"), resolve("demo", "smoke")
    assert smoke.data.num_clients < cpu.data.num_clients
    assert [m.algorithm for m in smoke.methods] == [m.algorithm for m in cpu.methods]
    assert all(m.config.epochs == 1 for m in smoke.methods)


def test_overrides_are_typed_and_wildcards_reach_every_method():
    cfg = resolve("demo", "cpu", ["data.partition.alpha=0.1", "methods.*.epochs=7", 'methods."FT (BN G)".lr=0.5',
                                  "pretrain.rounds=3", "seeds=2"])
    assert cfg.data.partition["alpha"] == 0.1
    assert {m.config.epochs for m in cfg.methods} == {7}
    assert next(m for m in cfg.methods if m.label == "FT (BN G)").config.lr == 0.5
    assert cfg.pretrain.config.rounds == 3 and cfg.seeds == 2


@pytest.mark.parametrize("override, key", [
    ("pretrain.rounds=many", "rounds"),
    ("pretrain.lr=-1", "lr"),
    ("pretrain.nonsense=1", "nonsense"),
    ("data.num_clients=0", "data.num_clients"),
    ("data.partition.beta=1", "data.partition.beta"),
    ("data.scheme=spiral", "data.scheme"),
    ('methods."FT (BN Q)".epochs=1', "FT (BN Q)"),
    ("methods.*.bogus=1", "bogus"),
    ("kernels=cuda", "kernels"),
    ("novel=1", "novel"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        resolve("demo", "cpu", [override])


def test_unknown_experiment_and_preset():
    with pytest.raises(ConfigError, match="not found"):
        resolve("no-such-experiment", "cpu")
    with pytest.raises(ConfigError, match="preset"):
        resolve("demo", "laptop")


def test_published_detail_holds_the_papers_other_numbers():
    """[published_detail]: Table 2's budget groups and Table 6's ARIs live in the experiment files, checked up front."""
    from pflkit.run.experiments import published_detail

    groups = resolve("pfedhn_table2_budget_c10", preset="cpu").published_detail["groups"]
    assert groups["pFedHN"] == [85.38, 86.92, 87.20] and len(groups) == 5
    ari = resolve("fedl2p_table3_domainnet_a0p1", preset="cpu").published_detail["ari"]
    assert (ari["bnnet_input"], ari["beta"], ari["lrnet_input"], ari["eta"]) == (0.27, 0.52, 0.65, 0.59)
    assert "ari" not in resolve("fedl2p_table3_cifar10c_a0p1", preset="cpu").published_detail  # not in Table 6
    with pytest.raises(ConfigError, match=r"published_detail\.ari\.beta"):
        published_detail({"ari": {"beta": "high"}})
    with pytest.raises(ConfigError, match=r"published_detail\.groups\.FedAvg"):
        published_detail({"groups": {"FedAvg": [1.0, True]}})


def test_experiment_tables_hold_only_the_keys_something_reads():
    """``[experiment]`` is not validated by `resolve` (its documentation keys are the report's): a
    misspelt ``finding`` or ``stands_in_for`` in a catalog file would be dropped silently."""
    from pflkit.run.experiments import tomllib

    read = {"name", "paper", "table", "title", "stands_in_for", "finding"}
    for name, path in list_experiments().items():
        with open(path, "rb") as f:
            keys = set(tomllib.load(f).get("experiment", {}))
        assert keys <= read, f"{name}: [experiment] {sorted(keys - read)} is read by nothing"
        assert {"paper", "table", "title"} <= keys, name


def test_a_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    """`pflkit demo --out demo` leaves a folder `demo/`: the name still means the built-in experiment."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "results.json").write_text("{}")
    assert resolve("demo", "smoke").name == "demo"
    with pytest.raises(ConfigError, match="not found"):
        resolve("missing.toml", "cpu")  # a .toml argument is a path, never a name
    own = tmp_path / "mine"  # an existing file is read as a file, whatever its suffix
    own.write_text((Path(list_experiments()["demo"])).read_text())
    assert resolve(str(own), "smoke").name == "mine"
