"""Mask overlap and density against hand computations (FedSelect Fig. 1)."""
import numpy as np
import pytest
import torch

from pflkit.analysis.masks import client_masks, density, iou, layer_density, pairwise_iou, sparsity


def _m(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def test_iou_by_hand():
    a, b = _m(1, 1, 0, 0, 1), _m(1, 0, 1, 0, 1)
    assert iou(a, b) == pytest.approx(2 / 4)  # both: 0, 4; either: 0, 1, 2, 4
    assert iou(a, a) == 1.0
    assert iou(a, ~a) == 0.0
    assert iou(_m(0, 0), _m(0, 0)) == 1.0  # two empty masks are identical


def test_dict_masks_concatenate_in_name_order_and_subset():
    a = {"w": _m(1, 0, 1), "b": _m(1)}
    b = {"w": _m(1, 1, 0), "b": _m(0)}
    assert iou(a, b) == pytest.approx(1 / 4)  # w: {0} of {0, 1, 2}; b: {} of {0}
    assert iou(a, b, names=["w"]) == pytest.approx(1 / 3)
    assert density(a) == pytest.approx(3 / 4) and sparsity(a) == pytest.approx(1 / 4)
    assert layer_density(a) == {"w": pytest.approx(2 / 3), "b": 1.0}
    with pytest.raises(KeyError, match="head"):
        iou(a, b, names=["head"])


def test_pairwise_matrix_is_symmetric_with_unit_diagonal():
    masks = [_m(1, 1, 0, 0), _m(0, 1, 1, 0), _m(0, 0, 1, 1)]
    got = pairwise_iou(masks)
    want = np.array([[1, 1 / 3, 0], [1 / 3, 1, 1 / 3], [0, 1 / 3, 1]])
    np.testing.assert_allclose(got, want)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="size"):
        iou(_m(1, 0), _m(1, 0, 1))
    with pytest.raises(TypeError, match="bool"):
        iou(torch.ones(3), torch.ones(3))


def test_client_masks_invert_fedselect_travel():
    states = {1: {"weights": {}, "travel": {"w": _m(1, 0)}}, 0: None, 2: {"weights": {}, "travel": {"w": _m(0, 0)}}}
    got = client_masks(states)
    assert list(got) == [1, 2]
    assert got[1]["w"].tolist() == [False, True] and got[2]["w"].tolist() == [True, True]
