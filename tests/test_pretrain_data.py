"""The pretraining stage's own data and weights (FedL2P sec. 4.3 / 4.4, App. D).

FedL2P personalizes a model pretrained where the clients' feature shift is unseen: CIFAR-10-C clients
fine-tune the FedAvg model of clean CIFAR-10, Office-Caltech-10 / DomainNet clients torchvision's
ImageNet ResNet-18 with a new head (the digit-domain stand-in: a CIFAR-10 model with a new head).
Pinned here: the pretraining data are disjoint from the clients', the head is re-initialized while
the body is carried exactly, every new setting is checked up front, results.json and the resume
fingerprint record the pretraining data, and the smoke run of a changed file runs end to end.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from pflkit.config import ConfigError
from pflkit.data.base import Dataset, DatasetMeta
from pflkit.data.datasets import load_dataset
from pflkit.run.experiment_config import NO_TRAINING
from pflkit.run.experiments import list_experiments, resolve
from pflkit.fl.algorithm import Env
from pflkit.io import load_torch
from pflkit.models import build_model, head_param_names
from pflkit.run.pretraining import carry_weights, check_pretrain_fits, client_data, load_pretrain_data
from pflkit.fl.federate import federation_for
from pflkit.run.folder import RunMismatchError
from pflkit.run.runner import run_experiment
from tests.helpers_data import digits_dataset

# a tiny experiment on the embedded sklearn digits: FedAvg pretraining on its own federation, one FT
TINY = {
    "experiment": {"name": "tiny-pretrain"},
    "data": {"dataset": "digits", "num_clients": 4, "partition": {"alpha": 1.0}},
    "model": {"name": "digits_cnn", "options": {"channels": [4, 8, 8]}},
    "pretrain": {"algorithm": "fedavg", "rounds": 2, "fraction": 1.0, "lr": 0.05, "eval_every": 1,
                 "new_head": True,
                 "data": {"dataset": "digits", "source_split": "train", "scheme": "iid", "num_clients": 2}},
    "methods": {"FT (BN C)": {"algorithm": "finetune", "bn": "client", "epochs": 1, "lr": 0.01}},
}


def _digest(images: torch.Tensor) -> set[str]:
    """One digest per image (its bytes), so that two image sets can be compared by content."""
    flat = images.reshape(len(images), -1).numpy()
    return {hashlib.sha1(row.tobytes()).hexdigest() for row in flat}


def _body(state: dict, model) -> dict:
    head = set(head_param_names(model))
    return {k: v for k, v in state.items() if k not in head}


# ----------------------------------------------------------------------------- settings checked up front

@pytest.mark.parametrize("override, key", [
    ("pretrain.data.bogus=1", "pretrain.data.bogus"),
    ("pretrain.data.dataset=nope", "pretrain.data.dataset"),
    ("pretrain.data.scheme=spiral", "pretrain.data.scheme"),
    ("pretrain.data.num_clients=0", "pretrain.data.num_clients"),
    ("pretrain.data.source_split=val", "pretrain.data.source_split"),
    ("pretrain.data.options={ size = 3 }", "pretrain.data.options.size"),
    ("pretrain.data.split=paired", "pretrain.data.split"),
    ("pretrain.new_head=maybe", "pretrain.new_head"),
    ("pretrain.normalize=imagenet", "pretrain.normalize"),
    ("pretrain.weights=/no/such/file.pt", "pretrain.weights"),
    ("pretrain.bogus=1", "pretrain.bogus"),
    ("pretrain.algorithm=nope", "pretrain.algorithm"),
])
def test_bad_pretraining_settings_are_one_line_errors_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        resolve(TINY, "cpu", [override])
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_a_stage_that_trains_nothing_takes_no_training_settings_or_data():
    with pytest.raises(ConfigError, match=r"^pretrain\.rounds: algorithm 'none' trains nothing"):
        resolve({**TINY, "pretrain": {"algorithm": "none", "rounds": 3}})
    with pytest.raises(ConfigError, match=r"^pretrain\.data=.*reads no pretraining data"):
        resolve({**TINY, "pretrain": {"algorithm": "none", "data": TINY["pretrain"]["data"]}})
    cfg = resolve({**TINY, "pretrain": {"algorithm": "none", "new_head": True}})
    assert cfg.pretrain.algorithm == NO_TRAINING and cfg.pretrain.separate
    assert cfg.to_dict()["pretrain"] == {"label": "Global", "algorithm": "none", "new_head": True}


def test_keep_best_of_the_pretraining_stage_needs_its_own_validation_split():
    with pytest.raises(ConfigError, match=r"^pretrain\.data\.val_fraction=0\.0"):
        resolve(TINY, "cpu", ["pretrain.data.val_fraction=0"])


def _rgb_digits() -> Dataset:
    """sklearn digits as 3-channel images: another input shape for the same classes."""
    d = digits_dataset()
    meta = DatasetMeta("rgb", 10, d.meta.class_names, (3, 8, 8), (0.3,) * 3, (0.4,) * 3)
    return Dataset(meta, d.x_train.repeat(1, 3, 1, 1), d.y_train, d.x_test.repeat(1, 3, 1, 1), d.y_test)


def test_a_pretraining_dataset_that_does_not_fit_the_model_fails_before_training():
    cfg = resolve(TINY, "cpu", ["pretrain.normalize=data"])
    with pytest.raises(ConfigError, match=r"^pretrain\.data\.dataset='digits': its inputs \(3, 8, 8\) do not fit"):
        check_pretrain_fits(cfg, digits_dataset(), _rgb_digits())
    with pytest.raises(ConfigError, match=r"^pretrain\.normalize='pretrain': 'digits' has 3 channel"):
        check_pretrain_fits(resolve(TINY), digits_dataset(), _rgb_digits())


def test_other_classes_need_a_new_head():
    d = digits_dataset()
    other = Dataset(DatasetMeta("letters", 10, tuple("abcdefghij"), (1, 8, 8)), d.x_train, d.y_train, d.x_test,
                    d.y_test)
    check_pretrain_fits(resolve(TINY), d, other)  # new_head = true: fine
    with pytest.raises(ConfigError, match=r"^pretrain\.new_head=false: the classes of 'digits' \(10: a, b, c, ...\)"):
        check_pretrain_fits(resolve(TINY, "cpu", ["pretrain.new_head=false"]), d, other)


def test_a_weights_file_must_fit_the_stage_model(tmp_path):
    wrong = build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8), channels=(8, 8, 8)).state_dict()
    torch.save(wrong, tmp_path / "w.pt")
    cfg = resolve(TINY, "cpu", [f"pretrain.weights={tmp_path / 'w.pt'}"])
    with pytest.raises(ConfigError, match=r"^pretrain\.weights=.*does not fit the stage's digits_cnn"):
        check_pretrain_fits(cfg, digits_dataset(), digits_dataset())
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"^pretrain\.weights=.*not a readable weights file"):
        check_pretrain_fits(resolve(TINY, "cpu", [f"pretrain.weights={tmp_path / 'junk.pt'}"]), digits_dataset(),
                            digits_dataset())


# ----------------------------------------------------------------------------- the weights carried

def test_new_head_reinitializes_the_head_and_carries_the_body_exactly():
    def make(classes):
        return build_model("lenet", num_classes=classes, input_shape=(3, 32, 32), width=8, bn=True)

    torch.manual_seed(1)
    source = make(10)
    for m in source.modules():  # non-default BN statistics, so that a forgotten buffer shows
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(), m.running_var.uniform_(1, 2), m.num_batches_tracked.fill_(7)
    pretrained = source.state_dict()
    env = Env(model_fn=lambda: make(10), seed=3)
    carried = carry_weights(pretrained, make(10), True, env)
    body = _body(pretrained, source)
    assert all(torch.equal(carried[k], v) for k, v in body.items())
    assert not torch.equal(carried["head.weight"], pretrained["head.weight"])  # same shape, still re-initialized
    bound = 1 / 84 ** 0.5  # nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert carried["head.weight"].abs().max() <= bound and carried["head.weight"].std() > bound / 3
    again = carry_weights(pretrained, make(10), True, Env(model_fn=lambda: make(10), seed=3))
    other = carry_weights(pretrained, make(10), True, Env(model_fn=lambda: make(10), seed=4))
    assert torch.equal(again["head.weight"], carried["head.weight"])  # seeded
    assert not torch.equal(other["head.weight"], carried["head.weight"])
    seven = carry_weights(pretrained, make(7), True, env)  # another class count: the body still fits
    assert seven["head.weight"].shape == (7, 84) and all(torch.equal(seven[k], v) for k, v in body.items())
    kept = carry_weights(pretrained, make(10), False, env)
    assert all(torch.equal(kept[k], v) for k, v in pretrained.items())


def test_clients_are_normalized_like_the_pretraining_data_unless_asked_otherwise():
    d, pre = digits_dataset(), _rgb_digits()
    used = client_data(resolve(TINY), d, pre)
    assert (used.meta.mean, used.meta.std) == (pre.meta.mean, pre.meta.std) and used.x_train is d.x_train
    assert client_data(resolve(TINY, "cpu", ["pretrain.normalize=data"]), d, pre).meta == d.meta


# ----------------------------------------------------------------------------- runs

def test_pretraining_on_its_own_federation_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = run_experiment(resolve(TINY), out, progress=False)
    assert res["status"] == "ok" and res["methods"]["Global"]["status"] == "ok"
    n_train = len(load_dataset("digits").y_train)  # the embedded digits: 1,438 train / 359 test
    with np.load(out / "seed0" / "pretrain" / "federation.npz") as z:
        idx = np.concatenate([z[k] for k in z.files if not k.startswith("__")])
    assert len(idx) == n_train and idx.max() < n_train  # source_split = "train": the test split is never drawn
    assert res["pretrain_data"]["name"] == "digits" and res["pretrain_data"]["source_split"] == "train"
    assert json.loads((out / "run.json").read_text())["fingerprint"]["pretrain_data"]["name"] == "digits"
    model = build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8), channels=(4, 8, 8))
    trained, carried = load_torch(out / "seed0/pretrain/global.weights.pt"), load_torch(out / "seed0/global.weights.pt")
    assert all(torch.equal(carried[k], v) for k, v in _body(trained, model).items())
    assert not torch.equal(carried["head.weight"], trained["head.weight"])
    record = json.loads((out / "seed0" / "global.json").read_text())
    assert record["pretraining"]["status"] == "ok" and len(record["history"]) == 2
    assert len(record["per_client"]) == 4  # the Global model tested on the experiment's clients
    with pytest.raises(RunMismatchError, match=r"pretrain\.data\.num_clients \(2 -> 3\)"):
        run_experiment(resolve(TINY, "cpu", ["pretrain.data.num_clients=3"]), out, resume=True, progress=False)
    again = run_experiment(resolve(TINY), out, resume=True, progress=False)
    assert again["methods"]["FT (BN C)"]["per_seed"] == res["methods"]["FT (BN C)"]["per_seed"]


def test_a_stage_that_trains_nothing_starts_from_a_weights_file(tmp_path):
    model = build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8), channels=(4, 8, 8))
    torch.save(model.state_dict(), tmp_path / "w.pt")
    spec = {**TINY, "pretrain": {"algorithm": "none", "new_head": True, "weights": str(tmp_path / "w.pt")}}
    res = run_experiment(resolve(spec), tmp_path / "run", progress=False)
    carried = load_torch(tmp_path / "run" / "seed0" / "global.weights.pt")
    assert all(torch.equal(carried[k], v) for k, v in _body(model.state_dict(), model).items())
    assert not torch.equal(carried["head.weight"], model.state_dict()["head.weight"])
    (entry,) = res["weights"]
    assert entry["sha256"] == hashlib.sha256((tmp_path / "w.pt").read_bytes()).hexdigest()
    assert res["methods"]["Global"]["status"] == "ok" and res["methods"]["FT (BN C)"]["status"] == "ok"
    fp = json.loads((tmp_path / "run" / "run.json").read_text())["fingerprint"]
    assert fp["pretrain_weights"]["sha256"] == entry["sha256"]


# ----------------------------------------------------------------------------- the FedL2P files (offline data)

FEDL2P = list_experiments()
CIFAR10C = sorted(n for n in FEDL2P if n.startswith("fedl2p_table") and "_cifar10c_" in n)
DIGITS = sorted(n for n in FEDL2P if n.startswith("fedl2p_") and "_digits" in n)
IMAGENET = sorted(n for n in FEDL2P if n.startswith("fedl2p_") and ("_domainnet_" in n or n.endswith("_caltech10")))


def test_every_feature_shift_file_pretrains_where_its_clients_are_unseen():
    # every digit-domain file, present or added later (e.g. fedl2p_conditioning_digits), has the property too
    assert len(CIFAR10C) == 8 and len(DIGITS) >= 16 and len(IMAGENET) == 15
    for name in CIFAR10C + DIGITS + IMAGENET:
        for preset in ("smoke", "cpu", "paper"):
            cfg = resolve(name, preset)
            st = cfg.pretrain
            if name in IMAGENET and preset == "paper":  # App. D: torchvision's ImageNet ResNet-18 + a new head
                assert st.algorithm == NO_TRAINING and st.new_head and st.data is None
                assert cfg.model.name == "resnet18_imagenet" and cfg.model.options["pretrained"] is True
                continue
            assert st.data.dataset == "cifar10" and st.data.dataset != cfg.data.dataset, name
            if name in CIFAR10C:  # the Table 2 model, alpha = 1000, on the train split; same classes
                assert (st.data.source_split, st.data.scheme, st.data.partition) == ("train", "dirichlet",
                                                                                     {"alpha": 1000.0})
                assert not st.new_head
            else:
                assert st.new_head and st.data.source_split == "train"


def test_missing_imagenet_weights_fail_in_one_line_before_any_data_is_read(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # no cached file
    monkeypatch.setenv("PFLKIT_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "download_url_to_file", pytest.fail)  # no download is tried
    cfg = resolve("fedl2p_table3_caltech10", "paper")
    # the ImageNet file is checked first: Office-Caltech-10 (not offline either) is never looked for
    with pytest.raises(ConfigError, match=r"^model\.options\.pretrained=true: torchvision's ResNet-18 ImageNet") as err:
        run_experiment(cfg, tmp_path / "run", data_root=tmp_path / "nothing", progress=False)
    assert "\n" not in str(err.value) and str(tmp_path / "torch") in str(err.value)
    assert not (tmp_path / "run" / "run.json").exists()


def test_cifar10c_pretraining_never_sees_a_client_image(shared_data):
    cfg = resolve("fedl2p_table3_cifar10c_a0p5", "smoke")
    pre = load_pretrain_data(cfg)
    full = load_dataset("cifar10")
    assert len(pre.y_test) == 0 and torch.equal(pre.x_train, full.x_train)
    fed = federation_for(cfg.pretrain.data, pre, seed=0)
    drawn = np.concatenate([c.splits[s] for c in fed.clients for s in ("train", "val", "test")])
    assert len(fed.x) == len(full.y_train) and np.array_equal(np.sort(drawn), np.arange(len(full.y_train)))
    # CIFAR-10-C is made of the test split: no pretraining image is one of them
    assert not _digest(fed.x) & _digest(full.x_test)
    assert load_dataset("cifar10c", per_corruption=5).meta.mean == pre.meta.mean  # one preprocessing


def test_digit_domain_pretraining_sees_no_client_domain(shared_data):
    cfg = resolve("fedl2p_table3_digits_a0p5", "smoke")
    clients = load_dataset(cfg.data.dataset, **cfg.data.options)
    pre = load_pretrain_data(cfg)
    assert pre.meta.name == "cifar10" and pre.meta.name not in clients.meta.group_names["domain"]
    assert not _digest(pre.x_train) & _digest(torch.cat([clients.x_train, clients.x_test]))


def test_smoke_run_of_a_digits_file_end_to_end(shared_data, tmp_path):
    res = run_experiment(resolve("fedl2p_table3_digits_a0p5", "smoke"), tmp_path, progress=False)
    assert res["status"] == "ok" and set(res["methods"]) >= {"Global", "FT (BN C)", "FedL2P"}
    assert res["pretrain_data"]["name"] == "cifar10" and res["data"]["name"] == "digit_domains"
    assert res["pretrain_data"]["mean"] == list(load_dataset("cifar10").meta.mean)
    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), width=8, bn=True)
    trained = load_torch(tmp_path / "seed0/pretrain/global.weights.pt")
    carried = load_torch(tmp_path / "seed0/global.weights.pt")
    assert all(torch.equal(carried[k], v) for k, v in _body(trained, model).items())
    assert not torch.equal(carried["head.weight"], trained["head.weight"])
