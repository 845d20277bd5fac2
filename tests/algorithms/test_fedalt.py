"""FedAlt: a fixed layer split, alternating personal / shared passes, only the shared part averaged."""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.fedalt import FEDALT, personal_names
from pflkit.algorithms.fedselect import personalized_state
from pflkit.config import ConfigError
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from tests.helpers_data import digits_dataset, digits_env


def test_personal_layers_by_split():
    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), bn=True)
    assert personal_names(model, "head") == ["head.weight", "head.bias"]
    assert personal_names(model, "input") == ["conv1.weight", "conv1.bias"]
    with pytest.raises(ValueError, match="split"):
        personal_names(model, "middle")


@pytest.mark.parametrize("split, layer", [("head", "head.weight"), ("input", "body.0.weight")])
def test_personal_layer_stays_local_shared_layers_are_global(split, layer):
    fed = build_federation(digits_dataset(), "shards", 3, seed=0, split="paired", val_fraction=0.0,
                           classes_per_client=2, samples_per_class=(20, 15))
    env = digits_env()
    env.seed_torch("init")
    cfg = FEDALT.make_config({"rounds": 2, "fraction": 1.0, "lr": 0.05, "batch_size": 10, "local_epochs": 1,
                              "split": split, "eval_every": 0, "keep_best": False})
    model = env.model_fn()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    res = run_rounds(FEDALT, cfg, fed, model, env)
    g = res.state["weights"]
    models = [personalized_state(res.state, cs, cfg) for cs in res.client_states.values()]
    assert not torch.equal(models[0][layer], models[1][layer])
    assert torch.equal(g[layer], init[layer])  # personal on every client: the server keeps its old value
    other = "body.3.weight"
    assert all(torch.equal(m[other], g[other]) for m in models)
    sizes = {n: p.numel() for n, p in env.model_fn().named_parameters()}
    assert res.history[-1]["client_personal_share"] == pytest.approx(
        sum(sizes[n] for n in sizes if n.startswith(layer.rsplit(".", 1)[0])) / sum(sizes.values()))


def test_registry_and_bad_settings():
    assert ALGORITHMS["fedalt"] is FEDALT
    with pytest.raises(ConfigError, match="split"):
        FEDALT.make_config({"split": "tail"})
    with pytest.raises(ConfigError, match="^alt_epoch='epoch'"):
        FEDALT.make_config({"alt_epoch": "epoch"})
    with pytest.raises(ConfigError, match="^local_steps=3"):
        FEDALT.make_config({"local_steps": 3})
