import pytest
import torch

from pflkit.fl.aggregate import masked_mean, precision_weighted_mean, weighted_mean


def test_weighted_mean_matches_hand_computation():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = weighted_mean([a, b], [1, 3])
    # (1*[1,2] + 3*[3,6]) / 4 = [2.5, 5.0]; integer buffers keep the maximum
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert int(out["n"]) == 5


def test_weighted_mean_rejects_bad_weights():
    with pytest.raises(ValueError, match="weights"):
        weighted_mean([{"w": torch.zeros(1)}], [0])
    with pytest.raises(ValueError, match="at least one"):
        weighted_mean([], [])


def test_masked_mean_keeps_fallback_where_nobody_shares():
    v1, v2 = torch.tensor([1.0, 10.0, 5.0]), torch.tensor([3.0, 20.0, 7.0])
    k1, k2 = torch.tensor([True, True, False]), torch.tensor([True, False, False])
    out = masked_mean([v1, v2], [k1, k2], [1, 1], fallback=torch.tensor([0.0, 0.0, -1.0]))
    assert torch.allclose(out, torch.tensor([2.0, 10.0, -1.0]))


def test_precision_weighted_mean():
    out = precision_weighted_mean([torch.tensor([0.0]), torch.tensor([4.0])], [1.0, 3.0])
    assert torch.allclose(out, torch.tensor([3.0]))
