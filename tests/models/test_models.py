"""Tests of the model zoo (pflkit.models): shapes, the head/features split,
parameter counts against hand computations, introspection, and a real-data run."""
from __future__ import annotations

import os
import urllib.error

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from pflkit.models import (
    MODELS,
    body_param_names,
    bn_modules,
    build_model,
    count_params,
    head_param_names,
    layer_input_modules,
    layer_param_names,
    model_options,
    state_nbytes,
)
from pflkit.models import resnet as resnet_mod

# Typical input shapes per model: (C, H, W) of one sample.
TYPICAL_SHAPES = {
    "resnet18_cifar": [(3, 32, 32), (1, 40, 32)],  # CIFAR; log-mel audio (FedL2P Speech Commands)
    "resnet18_imagenet": [(3, 64, 64)],
    "lenet": [(3, 32, 32), (1, 28, 28)],
    "omniglot_cnn": [(1, 28, 28), (1, 105, 105)],
    "cnn5": [(3, 32, 32), (1, 28, 28)],
    "digits_cnn": [(1, 8, 8)],
    "audio_cnn": [(1, 40, 32), (1, 64, 101)],
    "mlp": [(1, 8, 8), (3, 32, 32)],
}
CASES = [(name, shape) for name, shapes in TYPICAL_SHAPES.items() for shape in shapes]


def test_every_registered_model_has_typical_shapes():
    assert set(TYPICAL_SHAPES) == set(MODELS)


@pytest.mark.parametrize("name,shape", CASES)
def test_forward_shape_and_head_split(name, shape):
    torch.manual_seed(0)
    model = build_model(name, num_classes=7, input_shape=shape).eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        out, feats = model(x), model.features(x)
    assert out.shape == (3, 7)
    assert isinstance(model.head, nn.Linear) and model.head.out_features == 7
    assert feats.shape == (3, model.head.in_features)
    torch.testing.assert_close(out, model.head(feats), rtol=0, atol=0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(TYPICAL_SHAPES))
def test_head_and_body_names_partition_parameters(name):
    model = build_model(name, num_classes=5, input_shape=TYPICAL_SHAPES[name][0])
    head, body = head_param_names(model), body_param_names(model)
    all_names = [n for n, _ in model.named_parameters()]
    assert head == ["head.weight", "head.bias"]
    assert not set(head) & set(body)
    assert sorted(head + body) == sorted(all_names)
    assert body == [n for n in all_names if n not in head]  # order kept
    assert count_params(model, head) == model.head.in_features * 5 + 5


@pytest.mark.parametrize(
    "name,options,expected_bn",
    [
        # ResNet-18: stem BN + 2 per BasicBlock x 8 + 3 downsample BNs = 20
        ("resnet18_cifar", {}, 20),
        ("digits_cnn", {}, 3),
        ("audio_cnn", {}, 3),
        ("lenet", {}, 0),
        ("lenet", {"bn": True}, 2),
        ("cnn5", {}, 0),
        ("cnn5", {"bn": True}, 5),
        ("omniglot_cnn", {}, 0),
        ("omniglot_cnn", {"bn": True}, 4),
        ("mlp", {}, 0),
    ],
)
def test_bn_modules(name, options, expected_bn):
    model = build_model(name, num_classes=10, input_shape=TYPICAL_SHAPES[name][0], **options)
    found = bn_modules(model)
    assert len(found) == expected_bn
    assert all(isinstance(m, nn.BatchNorm2d) for _, m in found)
    assert [n for n, _ in found] == [
        n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)
    ]


def test_bn_modules_sees_mixed_batch_norm():
    from pflkit.models.mixed_bn import convert_bn

    model = convert_bn(build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8)))
    assert len(bn_modules(model)) == 3
    assert sum(type(m).__name__ == "MixedBatchNorm" for _, m in layer_input_modules(model)) == 3


def test_resnet18_cifar_parameter_count():
    model = build_model("resnet18_cifar", num_classes=10, input_shape=(3, 32, 32))
    # Independent: torchvision's ResNet-18 with a 10-way fc, minus its 7x7x3x64 stem
    # plus a 3x3x3x64 stem (no bias either way; the max-pool has no parameters).
    tv = torchvision.models.resnet18(weights=None, num_classes=10)
    expected = sum(p.numel() for p in tv.parameters()) - 64 * 3 * 7 * 7 + 64 * 3 * 3 * 3
    assert expected == 11_173_962  # the published count of CIFAR ResNet-18, 10 classes
    assert count_params(model) == expected
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert model.conv1.padding == (1, 1) and isinstance(model.maxpool, nn.Identity)
    # 3x32x32 stays 32x32 through the stem: layer4 sees 4x4 maps.
    with torch.no_grad():
        x = model.bn1(model.conv1(torch.zeros(1, 3, 32, 32)))
        x = model.layer3(model.layer2(model.layer1(model.maxpool(x))))
        assert model.layer4(x).shape == (1, 512, 4, 4)


def test_resnet_imagenet_matches_torchvision_layout():
    model = build_model("resnet18_imagenet", num_classes=10, input_shape=(3, 64, 64))
    tv = torchvision.models.resnet18(weights=None)
    ours = {k for k in model.state_dict() if not k.startswith("head.")}
    theirs = {k for k in tv.state_dict() if not k.startswith("fc.")}
    assert ours == theirs
    assert model.conv1.kernel_size == (7, 7) and isinstance(model.maxpool, nn.MaxPool2d)


def _lenet_params(c, w, hw_after, classes):
    conv1 = c * w * 5 * 5 + w
    conv2 = w * 2 * w * 5 * 5 + 2 * w
    fc1 = 2 * w * hw_after * 120 + 120
    return conv1 + conv2 + fc1 + (120 * 84 + 84) + (84 * classes + classes)


@pytest.mark.parametrize("width,expected", [(8, 62_958), (16, 121_182), (32, 256_830)])
def test_lenet_budgets(width, expected):
    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), width=width)
    # 32 -conv5-> 28 -pool-> 14 -conv5-> 10 -pool-> 5: 5x5 maps.
    assert expected == _lenet_params(3, width, 25, 10)
    assert model.conv1.out_channels == width and model.conv2.out_channels == 2 * width
    assert model.fc1.in_features == 2 * width * 25
    assert count_params(model) == expected
    if width == 16:  # the authors' target: FC 800 -> 120 -> 84 -> 10
        assert (model.fc1.in_features, model.fc2.in_features, model.head.in_features) == (800, 120, 84)


def test_lenet_on_mnist_shape():
    # 28 -> 24 -> 12 -> 8 -> 4
    model = build_model("lenet", num_classes=10, input_shape=(1, 28, 28))
    assert model.fc1.in_features == 32 * 16
    assert count_params(model) == _lenet_params(1, 16, 16, 10)


def test_layer_param_names_count_weights_and_biases():
    lenet = build_model("lenet", num_classes=10, input_shape=(3, 32, 32))
    # M = 5 layers with weight and bias: eta_1 .. eta_10
    assert layer_param_names(lenet) == [
        f"{layer}.{kind}" for layer in ("conv1", "conv2", "fc1", "fc2", "head")
        for kind in ("weight", "bias")
    ]
    resnet = build_model("resnet18_cifar", num_classes=10, input_shape=(3, 32, 32))
    # 20 bias-free convs + 20 BN (weight, bias) + head (weight, bias)
    assert len(layer_param_names(resnet)) == 20 + 2 * 20 + 2


@pytest.mark.parametrize("name", ["resnet18_cifar", "lenet", "cnn5", "omniglot_cnn", "digits_cnn", "mlp"])
def test_layer_input_modules_in_forward_order_and_own_every_parameter(name):
    shape = TYPICAL_SHAPES[name][0]
    options = {"bn": True} if name in ("lenet", "cnn5", "omniglot_cnn") else {}
    model = build_model(name, num_classes=4, input_shape=shape, **options).eval()
    layers = layer_input_modules(model)
    called = []
    handles = [m.register_forward_pre_hook(lambda mod, inp, n=n: called.append(n)) for n, m in layers]
    with torch.no_grad():
        model(torch.randn(2, *shape))
    for h in handles:
        h.remove()
    assert called == [n for n, _ in layers]
    owned = {f"{n}.{p}" for n, m in layers for p, _ in m.named_parameters(recurse=False)}
    assert owned == set(layer_param_names(model))
    assert layers[-1][1] is model.head


def test_count_params_and_state_nbytes_by_hand():
    model = build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8))
    # bias-free convs 1->16->32->32 (3x3), 3 BNs (weight, bias), head 32->10
    n_params = 9 * (16 + 16 * 32 + 32 * 32) + 2 * (16 + 32 + 32) + 32 * 10 + 10
    assert count_params(model) == n_params
    # float32 parameters + float32 running mean/var + one int64 counter per BN
    assert state_nbytes(model.state_dict()) == 4 * n_params + 4 * 2 * (16 + 32 + 32) + 8 * 3
    with pytest.raises(ValueError, match="nope"):
        count_params(model, ["nope"])


def test_init_is_deterministic_given_seed():
    def state(seed):
        torch.manual_seed(seed)
        return build_model("cnn5", num_classes=10, input_shape=(3, 32, 32)).state_dict()

    a, b, c = state(1), state(1), state(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.weight"], c["head.weight"])


def test_build_model_rejects_bad_input():
    with pytest.raises(ValueError, match="resnet18_cifar") as err:
        build_model("resnet50", num_classes=10, input_shape=(3, 32, 32))
    assert "'resnet50'" in str(err.value) and "digits_cnn" in str(err.value)
    with pytest.raises(TypeError, match="depth"):
        build_model("lenet", num_classes=10, input_shape=(3, 32, 32), depth=3)
    with pytest.raises(TypeError, match="bn"):
        build_model("resnet18_cifar", num_classes=10, input_shape=(3, 32, 32), bn=True)
    with pytest.raises(ValueError, match="input_shape"):
        build_model("lenet", num_classes=10, input_shape=(32, 32))
    with pytest.raises(ValueError, match="num_classes"):
        build_model("lenet", num_classes=0, input_shape=(3, 32, 32))
    with pytest.raises(ValueError, match="too small"):
        build_model("lenet", num_classes=10, input_shape=(3, 8, 8))
    with pytest.raises(ValueError, match="width"):
        build_model("lenet", num_classes=10, input_shape=(3, 32, 32), width=0)
    with pytest.raises(ValueError, match="pretrained"):
        build_model("resnet18_imagenet", num_classes=10, input_shape=(1, 64, 64), pretrained=True)
    assert model_options("lenet") == {"width": 16, "bn": False}


def test_pretrained_offline_raises_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def no_network(url, dst, *args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    with pytest.raises(RuntimeError) as err:
        build_model("resnet18_imagenet", num_classes=10, input_shape=(3, 224, 224), pretrained=True)
    msg = str(err.value)
    expected_path = os.path.join(str(tmp_path), "hub", "checkpoints", "resnet18-f37072fd.pth")
    assert "could not download" in msg and "TORCH_HOME" in msg
    assert expected_path in msg and resnet_mod.PRETRAINED_WEIGHTS.url in msg


def test_pretrained_loads_a_placed_file_offline(monkeypatch, tmp_path):
    # Following the error message's instructions must work: a file at the cache path is loaded.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "download_url_to_file", pytest.fail)
    torch.manual_seed(3)
    fake = torchvision.models.resnet18(weights=None).state_dict()
    path = resnet_mod.pretrained_cache_path()
    os.makedirs(os.path.dirname(path))
    torch.save(fake, path)
    model = build_model("resnet18_imagenet", num_classes=7, input_shape=(3, 64, 64), pretrained=True)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in fake.items() if not k.startswith("fc."))
    assert model.head.weight.shape == (7, 512)


def test_digits_cnn_learns_sklearn_digits():
    """Real data: a few seconds of Adam on sklearn digits gives > 85% test accuracy."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    to_t = lambda a: torch.tensor(a / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)  # noqa: E731
    x_tr, x_te, y_tr, y_te = to_t(x_tr), to_t(x_te), torch.tensor(y_tr), torch.tensor(y_te)
    torch.manual_seed(0)
    model = build_model("digits_cnn", num_classes=10, input_shape=(1, 8, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        perm = torch.randperm(len(x_tr), generator=gen)
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item()
    assert acc > 0.85
