"""pFedHN's figure helpers: TV to the nearest training client, mix-and-match, budget groups, sub-federations."""
import numpy as np
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.pfedhn import mix_and_match
from pflkit.analysis.pfedhn import group_accuracy, novel_tv, row_normalize
from pflkit.data.partition import nearest_tv, total_variation
from pflkit.fl.algorithm import Env
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from tests.helpers_data import digits_dataset


def test_total_variation_by_hand():
    p, q = [2, 2, 0], [0, 1, 1]  # counts: (.5, .5, 0) vs (0, .5, .5)
    assert float(total_variation(p, q)) == pytest.approx(0.5)
    assert float(total_variation([1, 0], [0, 3])) == pytest.approx(1.0)
    train = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 4]])
    dist, idx = nearest_tv([[3, 1, 0], [0, 1, 3]], train, return_index=True)
    # novel 0 = (.75, .25, 0): TV to train 0 = .25, to train 1 = .25, to train 2 = 1 -> .25 (first: 0)
    # novel 1 = (0, .25, .75): TV to train 2 = .25
    np.testing.assert_allclose(dist, [0.25, 0.25])
    assert idx.tolist() == [0, 2]


def test_subfederation_and_novel_tv():
    fed = build_federation(digits_dataset(), "class_dirichlet", 12, seed=0, alpha=[0.1] * 9 + [1.0] * 3)
    train, novel = fed.subset(range(9)), fed.subset([9, 10, 11])
    assert [c.id for c in novel.clients] == [0, 1, 2]
    assert np.array_equal(novel.clients[0].splits["train"], fed.clients[9].splits["train"])
    dist, idx = novel_tv(train, novel, basis="labels")
    h_n, h_t = novel.histograms(), train.histograms()
    for j in range(3):
        hand = [0.5 * np.abs(h_n[j] / h_n[j].sum() - h / h.sum()).sum() for h in h_t]
        assert dist[j] == pytest.approx(min(hand)) and idx[j] == int(np.argmin(hand))
    # the default, p_hat: each client's share of every class over all 12 clients (sec. 5.3)
    dist, idx = novel_tv(train, novel)
    h_all = fed.histograms()
    p_hat = h_all / h_all.sum(0)
    for j in range(3):
        hand = [0.5 * np.abs(p_hat[9 + j] - p_hat[i]).sum() for i in range(9)]
        assert dist[j] == pytest.approx(min(hand)) and idx[j] == int(np.argmin(hand))
    with pytest.raises(ValueError, match="distinct client ids"):
        fed.subset([0, 0])


class _Hists:
    """A federation as far as `novel_tv` looks: its clients' train label histograms."""

    def __init__(self, h):
        self.h = np.asarray(h)
        self.num_clients = len(self.h)

    def histograms(self, split="train"):
        return self.h


def test_novel_tv_on_p_hat_by_hand():
    train, novel = _Hists([[2, 0], [1, 3]]), _Hists([[1, 0], [0, 1]])
    # class totals over all four clients: (4, 4); p_hat rows: train (.5, 0), (.25, .75); novel (.25, 0), (0, .25)
    # novel 0: TV = 1/2 (.25 + 0) = .125 to train 0, 1/2 (0 + .75) = .375 to train 1
    # novel 1: TV = 1/2 (.5 + .25) = .375 to train 0, 1/2 (.25 + .5) = .375 to train 1 -> first (0)
    dist, idx = novel_tv(train, novel)
    np.testing.assert_allclose(dist, [0.125, 0.375])
    assert idx.tolist() == [0, 0]
    # the label-distribution TV of the older option differs: novel 0 = (1, 0) equals train 0's labels
    dist, idx = novel_tv(train, novel, basis="labels")
    np.testing.assert_allclose(dist, [0.0, 0.25])
    assert idx.tolist() == [0, 1]
    with pytest.raises(ValueError, match="basis"):
        novel_tv(train, novel, basis="counts")


def test_row_normalize_and_group_accuracy():
    acc = np.array([[0.5, 1.0, 0.75], [0.2, 0.2, 0.2]])
    np.testing.assert_allclose(row_normalize(acc), [[0.0, 1.0, 0.5], [1.0, 1.0, 1.0]])
    assert group_accuracy([1, 1, 0, 0, 0.5, 0.5], 3) == [1.0, 0.0, 0.5]


def test_mix_and_match_diagonal_is_each_clients_own_model():
    fed = build_federation(digits_dataset(), "pathological", 4, seed=0, classes_per_client=2)
    env = Env(model_fn=lambda: build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=(16,)), seed=0)
    algo = ALGORITHMS["pfedhn_pc"]
    cfg = algo.make_config({"rounds": 8, "local_steps": 5, "eval_every": 0, "hidden": 16, "depth": 1, "lr": 0.05})
    env.seed_torch("init")
    res = run_rounds(algo, cfg, fed, env.model_fn(), env)
    acc = mix_and_match(res.state, res.client_states, fed, cfg, env)
    own = [res.per_client[i]["acc"] for i in range(4)]
    np.testing.assert_allclose(np.diag(acc), own)
    assert acc.shape == (4, 4) and not np.allclose(acc, acc[:, :1])  # feature extractors differ across clients
    torch.testing.assert_close(torch.tensor(row_normalize(acc)).amax(1), torch.ones(4, dtype=torch.float64))


def test_personal_share_by_hand():
    from pflkit.analysis.pfedhn import personal_share

    gen = [{"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([2.0])},
           {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([2.0])}]
    # mean (2, 0); each client 1 away: 1 / 2. b is shared by both: 0
    assert personal_share(gen) == pytest.approx({"w": 0.5, "b": 0.0})


def test_linear_spectral_norms_read_the_raw_weight_of_a_normalized_layer():
    from torch.nn.utils.parametrizations import spectral_norm

    from pflkit.analysis.pfedhn import linear_spectral_norms

    plain = torch.nn.Linear(2, 2)
    with torch.no_grad():
        plain.weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 1.0]]))
    normed = spectral_norm(torch.nn.Linear(2, 2))
    with torch.no_grad():
        normed.parametrizations.weight.original.copy_(torch.tensor([[0.0, 5.0], [2.0, 0.0]]))
    net = torch.nn.Sequential(plain, normed)
    assert linear_spectral_norms(net) == pytest.approx({"0": 3.0, "1": 5.0})
    for _ in range(20):  # power iterations (one per read in training mode) catch up with the new weight
        weight = normed.weight
    assert float(torch.linalg.matrix_norm(weight.detach(), ord=2)) == pytest.approx(1.0, abs=1e-3)


def _lenet_targets() -> dict:
    """The shapes pFedHN's hypernetwork emits for the authors' CIFAR-10 LeNet (width 16)."""
    from pflkit.models import build_model

    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), width=16)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _share_at_init(num_clients: int, **kwargs) -> dict:
    """`personal_share` of a freshly built hypernetwork (seed 0) over its ``num_clients`` clients."""
    from pflkit.algorithms.hypernet import HyperNetwork
    from pflkit.analysis.pfedhn import personal_share

    torch.manual_seed(0)
    net = HyperNetwork(num_clients, _lenet_targets(), **kwargs).eval()
    with torch.no_grad():
        return personal_share([net(i) for i in range(num_clients)])


def test_spectral_norm_leaves_the_generated_weights_nearly_shared_at_init():
    """Table 4's SN rows (pfedhn_table4_sn_*, `[experiment] finding`): normalizing the heads divides their
    client-dependent output by sigma (up to ~18 for LeNet's fc1 head) while the heads' biases, shared by
    all clients, are left as they are; so at init SN's models are nearly one shared model."""
    from pflkit.algorithms.hypernet import HyperNetwork, default_embed_dim
    from pflkit.analysis.pfedhn import linear_spectral_norms

    targets = _lenet_targets()
    shares = {sn: _share_at_init(10, embed_dim=default_embed_dim(10), spectral_norm=sn) for sn in (False, True)}
    sigma = {sn: linear_spectral_norms(HyperNetwork(10, targets, embed_dim=default_embed_dim(10), spectral_norm=sn))
             for sn in (False, True)}
    assert min(sigma[False]["heads.fc1__weight"], sigma[True]["heads.fc1__weight"]) > 10
    for name in targets:
        if name.endswith("weight"):
            assert shares[True][name] < 0.25 * shares[False][name], name
    assert shares[True]["fc1.weight"] < 0.05 * shares[False]["fc1.weight"]


def test_class_proportion_embeddings_start_less_personal_than_learned_ones():
    """App. C.5 (pfedhn_appc5_fixed_embeddings, `[experiment] finding`): a client's class proportions
    p_hat (norm <= 1) feed the trunk a smaller, less varied input than the N(0, 1) rows of a learned
    embedding (norm ~ sqrt(d)), so the client-dependent part of the generated weights starts smaller."""
    p_hat = torch.tensor(np.random.default_rng(0).dirichlet([0.1] * 10, size=50), dtype=torch.float32)
    a, b = _share_at_init(50, embed_dim=10), _share_at_init(50, fixed_embeddings=p_hat)
    for name in _lenet_targets():
        if name.endswith("weight"):
            assert b[name] < 0.5 * a[name], name


def test_each_trunk_layer_shrinks_the_personal_part_at_init():
    """App. C.2.3 (pfedhn_ablation_depth, `[experiment] finding`): every ReLU + Linear(100, 100) block of
    the trunk, at PyTorch's default init, shrinks the client-dependent part of the generated weights
    (about 2.3x a block), while the heads' shared biases stay as they are."""
    from pflkit.algorithms.hypernet import default_embed_dim

    share = [_share_at_init(50, embed_dim=default_embed_dim(50), depth=depth)["fc1.weight"] for depth in range(1, 6)]
    assert all(1.5 < a / b < 4 for a, b in zip(share, share[1:])), share
    assert share[0] > 0.5 and share[-1] < 0.06, share
