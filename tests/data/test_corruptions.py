"""CIFAR-10-C corruptions against hand computations and invariants, and the cifar10c loader."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.colors import rgb_to_hsv as mpl_rgb_to_hsv

from pflkit.data.corruptions import (
    CORRUPTIONS, LEVELS, corrupt, hsv_to_rgb, motion_blur_images, motion_blur_kernel, plasma_fractal, rgb_to_hsv,
)
from pflkit.data.datasets import load_dataset
from pflkit.fl.federate import build_federation

RANDOM = ("frost", "snow", "motion_blur", "speckle_noise", "fog")



def smooth_images(n=6, size=32, seed=0):
    """Natural-ish images: upsampled noise (so blurs and JPEG behave as on photographs)."""
    rng = np.random.default_rng(seed)
    small = rng.uniform(30, 225, (n, size // 4, size // 4, 3))
    return np.repeat(np.repeat(small, 4, axis=1), 4, axis=2).astype(np.uint8)


def const(value, n=2, size=32):
    return np.full((n, size, size, 3), value, dtype=np.uint8)


def test_hsv_matches_matplotlib_and_round_trips():
    rgb = np.random.default_rng(1).uniform(0, 1, (500, 3))
    rgb[:5] = [[0, 0, 0], [1, 1, 1], [0.3, 0.3, 0.3], [1, 0, 0], [0.2, 0.9, 0.2]]  # grays and pure hues
    np.testing.assert_allclose(rgb_to_hsv(rgb), mpl_rgb_to_hsv(rgb), atol=1e-12)
    np.testing.assert_allclose(hsv_to_rgb(rgb_to_hsv(rgb)), rgb, atol=1e-12)


def test_every_corruption_keeps_shape_and_is_deterministic():
    x = smooth_images(3)
    for name in CORRUPTIONS:
        y = corrupt(x, name, 3, seed=0)
        assert y.shape == x.shape and y.dtype == np.uint8, name
        assert np.array_equal(y, corrupt(x, name, 3, seed=0)), name
        assert not np.array_equal(y, x), f"{name} left the images unchanged"
        if name in RANDOM:
            assert not np.array_equal(y, corrupt(x, name, 3, seed=1)), f"{name} ignores the seed"
    assert corrupt(x[0], "contrast").shape == (32, 32, 3)  # a single image


def test_bad_arguments_are_rejected():
    x = const(10)
    with pytest.raises(ValueError, match="unknown corruption 'blur'"):
        corrupt(x, "blur")
    for bad in (0, 6, 2.5, True):
        with pytest.raises(ValueError, match="severity"):
            corrupt(x, "fog", bad)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(x.astype(np.float32), "fog")
    with pytest.raises(ValueError, match="uint8"):
        corrupt(x[..., :1], "fog")


def test_brightness_and_saturate_by_hand():
    # a gray pixel 100: HSV value 100/255 + 0.15 on every channel -> 138.25 -> 138
    assert np.all(corrupt(const(100), "brightness", 3) == 138)
    # saturation of a gray is 0, so saturate (s -> 1.5 s) leaves it unchanged
    assert np.array_equal(corrupt(const(77), "saturate", 3), const(77))
    # (200, 100, 50): v = 200, s = 0.75 -> 1 (clipped), hue kept: (200, 200/3, 0) -> (200, 66, 0)
    px = np.array([[[[200, 100, 50]]]], dtype=np.uint8)
    assert corrupt(px, "saturate", 3).reshape(3).tolist() == [200, 66, 0]


def test_contrast_shrinks_deviations_from_the_channel_mean():
    x = smooth_images(4)
    y = corrupt(x, "contrast", 3).astype(float)
    xf = x.astype(float)
    mean = xf.mean(axis=(1, 2), keepdims=True)
    expected = mean + LEVELS["contrast"][2] * (xf - mean)
    assert np.all(y <= expected + 1e-6) and np.all(y > expected - 1)  # truncation only


def test_speckle_is_multiplicative_and_unbiased():
    assert np.array_equal(corrupt(const(0), "speckle_noise", 5), const(0))  # black stays black
    x = const(120, n=20)
    y = corrupt(x, "speckle_noise", 3).astype(float)
    # x (1 + N(0, 0.12)): std 120 * 0.12 = 14.4, mean 120 (minus 0.5 for truncation)
    assert abs(y.std() - 14.4) < 0.5 and abs(y.mean() - 119.5) < 0.5


def test_fog_stays_between_its_bounds():
    v = 128 / 255
    y = corrupt(const(128, n=4), "fog", 3) / 255.0
    strength = LEVELS["fog"][2][0]
    # (v + c fog) v / (v + c) with fog in [0, 1]: from v^2 / (v + c) up to v
    assert y.max() <= v + 1e-9 and y.min() >= v * v / (v + strength) - 1 / 255
    assert y.std() > 0.02  # a visible fractal, not a constant


def test_frost_and_snow_bounds():
    black = corrupt(const(0, n=8), "frost", 3)
    assert black.max() <= int(0.4 * 255) and black.std() > 3  # 0.9 * 0 + 0.4 * frost texture
    # gray 0.2 -> 0.9 * 0.2 + 0.1 * max(0.2, 1.5 * 0.2 + 0.5) = 0.26 before the (non-negative) snow
    snow = corrupt(const(51, n=8), "snow", 3)
    assert snow.min() >= int(0.26 * 255) and (snow > 70).mean() > 0.01


def test_motion_blur_kernel_and_impulse_response():
    k = motion_blur_kernel(6, 2.0)
    assert k.size == 13 and abs(k.sum() - 1) < 1e-12 and np.all(np.diff(k) < 0)
    k2 = motion_blur_kernel(2, 1.0)
    img = np.zeros((2, 5, 9))
    img[:, 2, 4] = 1.0
    out = motion_blur_images(img, 2, 1.0, np.array([0.0, 90.0]))
    # angle 0: tap i reads i columns to the right, so the impulse shows up i columns to its left
    np.testing.assert_allclose(out[0, 2, :5], k2[::-1], atol=1e-12)
    assert out[0].sum() == pytest.approx(1.0) and np.count_nonzero(out[0]) == 5
    np.testing.assert_allclose(out[1, :3, 4], k2[2::-1], atol=1e-12)  # angle 90: along the column


def test_motion_blur_keeps_flat_images_flat():
    assert np.array_equal(corrupt(const(90), "motion_blur", 3), const(90))


def test_pixelate_and_jpeg_grow_with_severity():
    x = np.random.default_rng(3).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    for name in ("pixelate", "jpeg_compression", "contrast", "speckle_noise"):
        err = [np.abs(corrupt(x, name, s).astype(float) - x).mean() for s in (1, 3, 5)]
        assert err[0] < err[1] < err[2], (name, err)
    assert np.array_equal(corrupt(const(33), "pixelate", 3), const(33))


def test_plasma_fractal_range_and_smoothness():
    rng = np.random.default_rng(0)
    rough, smooth = plasma_fractal(8, 32, 1.5, rng), plasma_fractal(8, 32, 3.0, rng)
    assert rough.shape == (8, 32, 32)
    assert np.allclose(rough.min(axis=(1, 2)), 0) and np.allclose(rough.max(axis=(1, 2)), 1)

    def step(m):
        return np.abs(np.diff(m, axis=2)).mean()

    assert step(smooth) < step(rough)
    with pytest.raises(ValueError, match="power of two"):
        plasma_fractal(1, 24, 2.0, rng)


# ---------------------------------------------------------------- the cifar10c dataset


def write_cifar_npz(root, n_train=12, n_test=6):
    rng = np.random.default_rng(5)
    x_train = rng.integers(0, 256, (n_train, 32, 32, 3), dtype=np.uint8)
    x_test = smooth_images(n_test, seed=2)
    y_test = np.arange(n_test) % 10
    names = np.array(["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"])
    np.savez(root / "cifar10.npz", x_train=x_train, y_train=np.arange(n_train) % 10, x_test=x_test, y_test=y_test,
             class_names=names)
    return x_train, x_test, y_test


def test_cifar10c_is_the_corrupted_test_split(tmp_path):
    x_train, x_test, y_test = write_cifar_npz(tmp_path)
    ds = load_dataset("cifar10c", tmp_path, corruptions=("contrast", "fog"), seed=3)
    assert ds.x_train.shape == (12, 3, 32, 32) and ds.x_test.shape[0] == 0 and ds.y_test.numel() == 0
    assert ds.groups_train["corruption"].tolist() == [0] * 6 + [1] * 6
    assert ds.meta.group_names["corruption"] == ("contrast", "fog")
    assert ds.y_train.tolist() == np.tile(y_test, 2).tolist()
    fog = torch.from_numpy(corrupt(x_test, "fog", 3, seed=3).transpose(0, 3, 1, 2))
    assert torch.equal(ds.x_train[6:], fog)
    np.testing.assert_allclose(ds.meta.mean, (x_train / 255.0).mean(axis=(0, 1, 2)), atol=1e-6)  # clean train stats
    assert torch.equal(load_dataset("cifar10c", tmp_path, corruptions=("contrast", "fog"), seed=3).x_train, ds.x_train)

    sub = load_dataset("cifar10c", tmp_path, per_corruption=4, severity=1)
    assert sub.x_train.shape[0] == 40 and sub.meta.group_names["corruption"] == CORRUPTIONS
    labels = sub.y_train.reshape(10, 4)
    assert all(torch.equal(labels[0], row) for row in labels)  # the same images under every corruption


@pytest.mark.parametrize("options, match", [
    ({"severity": 0}, "severity"), ({"corruptions": ("blur",)}, "corruptions"),
    ({"per_corruption": 0}, "per_corruption"),
])
def test_cifar10c_rejects_bad_options(tmp_path, options, match):
    write_cifar_npz(tmp_path)
    with pytest.raises(ValueError, match=match):
        load_dataset("cifar10c", tmp_path, **options)


def test_cifar10c_domain_federation_on_real_cifar(shared_data):
    ds = load_dataset("cifar10c", shared_data, per_corruption=20)
    fed = build_federation(ds, "domains", 20, seed=0, key="corruption", alpha=0.5)
    groups = ds.groups_train["corruption"]
    assert fed.group_of_clients("corruption").tolist() == np.repeat(np.arange(10), 2).tolist()
    for c in fed.clients:
        idx = np.concatenate([c.splits[s] for s in ("train", "val", "test")])
        assert np.all(groups[idx] == c.info["corruption"])  # a client never mixes corruptions
