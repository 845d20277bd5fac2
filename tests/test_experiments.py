import pytest

from pflkit.config import ConfigError
from pflkit.experiments import list_experiments, resolve


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
