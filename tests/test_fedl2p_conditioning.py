"""Do FedL2P's meta-nets condition on the client? (Eq. 4, App. E; the ARI of Table 6.)

Under App. E's initialization (Xavier gain 0.1 in all three layers) the input-to-output
Jacobian of BNNet / LRNet is ~1e-4, so clients whose statistics differ by O(0.1) get
hyperparameters that differ by ~1e-5, and clipped SGD at the paper's rate 1e-3 barely
changes that: the gradient reaching the first layer is damped by the two small layers
above it. These tests pin that mechanism on a toy problem with an exact, domain-dependent
optimum, the ``hidden_gain`` option that lifts it, and the report that exposes it (the
ARI alone is scale-free and cannot).
"""
import torch

from pflkit.analysis.clustering import NEAR_CONSTANT, cluster_ari, group_spread, meta_net_clustering
from pflkit.meta.metanets import MetaSpec, bnnet, init_meta_params, input_sensitivity


def _two_domains(n=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dom = torch.arange(n) % 2
    # BNNet inputs as measured on the cpu digits (xi of 0.1-0.5, domains 0.3 apart)
    xi = torch.where(dom[:, None] == 0, torch.tensor([0.1, 0.2]), torch.tensor([0.4, 0.5]))
    return xi + 0.02 * torch.randn(n, 2, generator=gen), dom


def _fit(net, xi, target, steps, lr=1e-3, clip=1.0):
    """Clipped SGD on sum_b (beta_b - target)^2, the paper's meta rate and clip (sec. 4.1)."""
    for _ in range(steps):
        loss = ((net(xi) - target) ** 2).sum(1).mean()
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad.clamp(-clip, clip)
    with torch.no_grad():
        return net(xi).numpy()


def test_app_e_init_cannot_learn_a_domain_dependent_beta_in_few_steps():
    torch.manual_seed(0)
    xi, dom = _two_domains()
    target = torch.where(dom == 0, 0.2, 0.8)[:, None].expand(-1, 2)  # the optimum differs by domain
    paper = _fit(bnnet(2, generator=torch.Generator().manual_seed(1)), xi, target, 200)
    wide = _fit(bnnet(2, hidden_gain=1.0, generator=torch.Generator().manual_seed(1)), xi, target, 200)
    sp_paper, sp_wide = group_spread(paper, dom.numpy()), group_spread(wide, dom.numpy())
    # App. E: the mean is learned (0.5), the domains are not: beta is the same for every client
    assert abs(paper.mean() - 0.5) < 0.01 and sp_paper["between"] < 1e-3
    # hidden layers at gain 1: the same steps separate the domains, in the right direction
    assert sp_wide["between"] > 10 * max(sp_paper["between"], 1e-4)
    assert wide[dom.numpy() == 1].mean() > wide[dom.numpy() == 0].mean()
    # both outputs cluster perfectly by domain: the ARI cannot tell them apart, the spread can
    assert cluster_ari(paper, dom.numpy()) == 1.0 and cluster_ari(wide, dom.numpy()) == 1.0


def test_sensitivity_scales_with_the_hidden_gain_squared_and_outputs_stay_at_the_biases():
    spec = MetaSpec(num_bn=2, num_layers=7, num_tensors=14)
    wide = MetaSpec(num_bn=2, num_layers=7, num_tensors=14, hidden_gain=1.0)
    xi, feats = torch.tensor([0.3, 0.4]), torch.rand(14, generator=torch.Generator().manual_seed(0))
    s0 = input_sensitivity(spec, spec.modules(), init_meta_params(spec, torch.Generator().manual_seed(3)), xi, feats)
    s1 = input_sensitivity(wide, wide.modules(), init_meta_params(wide, torch.Generator().manual_seed(3)), xi, feats)
    for net in ("bnnet", "lrnet"):
        # same draws, hidden weights x10: the Jacobian (product of the 3 layers) x100 where the
        # ReLUs stay active; a few units switch off at gain 1, hence the band
        assert 30 < s1[net] / s0[net] <= 100 * 1.001
        assert s0[net] < 1e-3
    lam = init_meta_params(wide, torch.Generator().manual_seed(3))
    with torch.no_grad():
        beta = wide.modules()["bnnet"](xi[None]).squeeze(0)
    assert lam["bnnet.body.4.bias"].eq(0.5).all() and (beta - 0.5).abs().max() < 0.2  # still ~0.5 (App. E)


def test_report_flags_a_near_constant_output_that_clusters_perfectly():
    xi, dom = _two_domains(n=10)
    net = bnnet(2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        beta = net(xi).numpy()  # App. E init: ordered by the inputs, but ~1e-5 apart
    rows = [{"client": i, "xi": xi[i].tolist(), "beta": {"bn1": float(beta[i, 0]), "bn2": float(beta[i, 1])},
             "features": xi[i].tolist(), "eta": {"w": 0.01, "b": 0.01}, "sparsity": 0.0} for i in range(len(dom))]
    c = meta_net_clustering(rows, dom.numpy())
    assert c["xi"]["ari"] == 1.0 and c["beta"]["ari"] == 1.0
    assert c["beta"]["between_rel"] < NEAR_CONSTANT and c["beta"]["near_constant"]
    assert not c["xi"]["near_constant"] and c["xi"]["between"] > 0.1
    assert c["eta"]["between"] == 0 and c["eta"]["near_constant"]  # the same eta for everyone


def test_by_domain_figure_titles_carry_the_spread():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pflkit.report.fedl2p.figures import plot_hyperparameters_by_domain

    dom = [0, 0, 1, 1]
    rows = [{"client": i, "xi": [0.1 * d], "beta": {"bn1": 0.2 + 0.4 * d}, "features": [float(d)],
             "eta": {"w": 0.01 * (1 + d), "b": 0.01}, "sparsity": 0.0} for i, d in enumerate(dom)]
    fig = plot_hyperparameters_by_domain(rows, dom, ["MNIST", "USPS"], "t")
    left, right = fig.axes[:2]
    # beta: domain means 0.2 / 0.6, SD 0.2, nothing within; eta.w: 0.01 / 0.02 (SD 0.005), eta.b constant
    assert left.get_title() == "beta: between-domain SD 0.2 (50% of level), within 0 (0% of level)"
    # sqrt((0.005^2 + 0) / 2); relative: sqrt(((0.005 / 0.015)^2 + 0) / 2) = 24%
    assert right.get_title().startswith("eta: between-domain SD 0.00354 (24% of level), within 0")
    plt.close(fig)


def test_fedl2p_config_carries_hidden_gain_to_the_meta_nets():
    import pytest

    from pflkit.algorithms import get_algorithm
    from pflkit.algorithms.fedl2p_client import model_spec
    from pflkit.config import ConfigError
    from pflkit.models import build_model

    algo = get_algorithm("fedl2p")
    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), bn=True, width=8)
    assert model_spec(model, algo.make_config({})).hidden_gain == 0.0  # App. E by default
    spec = model_spec(model, algo.make_config({"hidden_gain": 1.0}))
    lam = init_meta_params(spec, torch.Generator().manual_seed(0))
    first, last = lam["bnnet.body.0.weight"], lam["bnnet.body.4.weight"]
    # Xavier-normal: std = gain * sqrt(2 / (fan_in + fan_out))
    assert first.std().item() == pytest.approx(1.0 * (2 / sum(first.shape)) ** 0.5, rel=0.15)
    assert last.std().item() == pytest.approx(0.1 * (2 / sum(last.shape)) ** 0.5, rel=0.15)
    with pytest.raises(ConfigError, match="hidden_gain"):
        algo.make_config({"hidden_gain": -1.0})
