"""FedL2P's meta-nets BNNet and LRNet (Eq. 4, App. E) and the meta-parameters lambda.

Both meta-nets are 3-layer MLPs, ``Linear(in, 100) - ReLU - Linear(100, 100) - ReLU -
Linear(100, out)``, whose output is clamped with a straight-through estimator (STE,
Bengio et al. 2013): the forward pass clamps, the backward pass is the identity:

* BNNet: ``(xi_1 .. xi_B) -> beta in [0, 1]^B``, one mixing weight per BN layer (Eq. 2);
* LRNet: ``(E(x_0), SD(x_0), .., E(x_{M-1}), SD(x_{M-1})) -> [0, 1000]^P``, one factor per
  parameter tensor; the learning rates are ``eta = LRNet(..) * eta_tilde`` with a
  learnable post-multiplier ``eta_tilde`` (one per tensor, not restricted to be positive,
  started at the fine-tuning learning rate; App. D).

Reading of "eta_1 .. eta_2M" (Eq. 4, footnote 4 "we assume all layers have weights and
biases"): one learning rate per weight or bias *tensor*, ``P = len(model.named_parameters())``
outputs (2M when every layer has both; BN's gamma and delta included) -- as the authors'
code. Initialization (App. E): Xavier-normal weights with gain 0.1 and constant biases
0.5 (BNNet) / 1.0 (LRNet) in every linear layer, so the initial outputs are ~0.5 / ~1.0.

How strongly the outputs depend on the client: the input-to-output Jacobian of the MLP is
the product of its three weight matrices, so it scales with the product of the three
gains (0.1^3 under App. E; `input_sensitivity` measures it, ~1e-4 per unit of input for
the LeNet meta-nets). A client's beta / eta then differs from another's by about that
factor times the difference of their statistics, and the hypergradient that reaches the
first layer is damped by the two layers above it (largest first-layer weight gradient
~2e-3 of the last layer's on 7 BN inputs of O(0.3); 4.5e-3 with ``hidden_gain`` 1).
Where the statistics differ by O(0.1) between clients (the cpu-scale digits) the outputs
start, and after a few dozen clipped meta steps stay, almost constant across clients.
The clamp adds a second effect. The STE passes gradients through a clamped output, so once
the hypergradient favours beta = 0 (the pretrained statistics, as for CIFAR-10 in Fig. 2a)
it keeps pushing the pre-clamp value down, past every client's bound: on
``fedl2p_conditioning_digits`` at ``cpu`` (seed 0) BNNet's raw outputs sank to about -2.2 /
-3.7 by round 40, 0.004-0.006 apart across clients, and every client's beta read exactly 0,
although BNNet's input sensitivity had grown 60x. STE and clamp are App. E's and the
authors' (``ClampSTE`` in their ``model_utils.py``) and stay the default.
``hidden_gain`` (not the paper's) gives the two hidden layers their own gain while the
output layer keeps ``gain``: the initial outputs stay ~ the biases (App. E's purpose of the
small gain), the client dependence grows by ``(hidden_gain / gain)^2``.

The meta-parameters lambda = {w_bn, w_lr, eta_tilde} travel as a flat dict of tensors
(``"bnnet.<key>"``, ``"lrnet.<key>"``, ``"eta_tilde"``) so that FedAvg, checkpoints and
`torch.func.functional_call` treat them uniformly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["clamp_ste", "MetaNet", "bnnet", "lrnet", "MetaSpec", "init_meta_params", "meta_hyperparams",
           "GROUPS", "group_of", "input_sensitivity"]

GROUPS = ("bnnet", "lrnet", "eta_tilde")


class _ClampSTE(torch.autograd.Function):
    # forward / setup_context split: usable under torch.func transforms (jacrev, vmap)
    @staticmethod
    def forward(x, lo, hi):
        return x.clamp(lo, hi)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None

    @staticmethod
    def vmap(info, in_dims, x, lo, hi):
        return x.clamp(lo, hi), in_dims[0]


def clamp_ste(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Clamp to ``[lo, hi]`` in the forward pass, pass gradients straight through (App. E)."""
    if not lo <= hi:
        raise ValueError(f"clamp_ste: need lo <= hi, got lo={lo!r}, hi={hi!r}")
    return _ClampSTE.apply(x, float(lo), float(hi))


class MetaNet(nn.Module):
    """A 3-layer MLP with a clamp-STE output (App. E).

    ``gain``: Xavier-normal gain of every linear layer (App. E: 0.1); ``hidden_gain``: if
    given, the gain of the first two layers instead (the output layer keeps ``gain``).
    """

    def __init__(self, in_features: int, out_features: int, *, max_value: float, bias_init: float,
                 hidden: int = 100, gain: float = 0.1, hidden_gain: float | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        for key, value in (("in_features", in_features), ("out_features", out_features), ("hidden", hidden)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MetaNet: {key} must be a positive int, got {value!r}")
        self.max_value = float(max_value)
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, out_features))
        for key, value in (("gain", gain), ("hidden_gain", hidden_gain)):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and not (number and value > 0):
                raise ValueError(f"MetaNet: {key} must be > 0, got {value!r}")
        linears = [layer for layer in self.body if isinstance(layer, nn.Linear)]
        gains = [gain if hidden_gain is None else hidden_gain] * (len(linears) - 1) + [gain]
        with torch.no_grad():
            for layer, g in zip(linears, gains):
                nn.init.xavier_normal_(layer.weight, gain=g, generator=generator)
                layer.bias.fill_(bias_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clamp_ste(self.body(x), 0.0, self.max_value)


def bnnet(num_bn: int, *, hidden: int = 100, gain: float = 0.1, bias_init: float = 0.5,
          hidden_gain: float | None = None, generator: torch.Generator | None = None) -> MetaNet:
    """BNNet: B KL distances in, B betas in [0, 1] out (Eq. 4)."""
    return MetaNet(num_bn, num_bn, max_value=1.0, bias_init=bias_init, hidden=hidden, gain=gain,
                   hidden_gain=hidden_gain, generator=generator)


def lrnet(num_layers: int, num_tensors: int, *, hidden: int = 100, gain: float = 0.1, bias_init: float = 1.0,
          max_value: float = 1000.0, hidden_gain: float | None = None,
          generator: torch.Generator | None = None) -> MetaNet:
    """LRNet: 2M feature statistics in, one factor in [0, max_value] per parameter tensor out (Eq. 4)."""
    return MetaNet(2 * num_layers, num_tensors, max_value=max_value, bias_init=bias_init, hidden=hidden,
                   gain=gain, hidden_gain=hidden_gain, generator=generator)


@dataclass(frozen=True)
class MetaSpec:
    """Sizes and switches of one model's meta-nets.

    Attributes:
        num_bn: B, BN layers (BNNet's input and output size).
        num_layers: M, layers whose inputs LRNet summarizes (LRNet input 2M).
        num_tensors: P, parameter tensors (LRNet output size, one eta each).
        use_bnnet: learn beta with BNNet (else ``fixed_beta``).
        use_lrnet: learn eta with LRNet and eta_tilde (else eta = ``fixed_lr`` for every tensor).
        fixed_beta: beta of every BN layer when BNNet is off (LRNet-only ablation, Table 5).
        fixed_lr: the fine-tuning learning rate; eta_tilde's initial value.
        hidden, gain, bn_bias, lr_bias, lr_max: App. E architecture and initialization.
        hidden_gain: Xavier gain of the two hidden layers; 0 (default) = ``gain`` in every
            layer, App. E and the authors' code. Not the paper's otherwise (module docstring).
    """

    num_bn: int
    num_layers: int
    num_tensors: int
    use_bnnet: bool = True
    use_lrnet: bool = True
    fixed_beta: float = 1.0
    fixed_lr: float = 1e-3
    hidden: int = 100
    gain: float = 0.1
    bn_bias: float = 0.5
    lr_bias: float = 1.0
    lr_max: float = 1000.0
    hidden_gain: float = 0.0

    def __post_init__(self):
        if self.use_bnnet and self.num_bn < 1:
            raise ValueError("BNNet needs a model with BatchNorm layers (num_bn = 0); switch BNNet off "
                             "(use_bnnet=False, the LRNet-only variant)")
        if self.use_lrnet and (self.num_layers < 1 or self.num_tensors < 1):
            raise ValueError(f"LRNet needs layers and parameters, got num_layers={self.num_layers}, "
                             f"num_tensors={self.num_tensors}")
        if not 0.0 <= self.fixed_beta <= 1.0:
            raise ValueError(f"fixed_beta={self.fixed_beta!r}: must be in [0, 1]")
        number = isinstance(self.hidden_gain, (int, float)) and not isinstance(self.hidden_gain, bool)
        if not (number and self.hidden_gain >= 0):
            raise ValueError(f"hidden_gain={self.hidden_gain!r}: must be >= 0 (0: the same gain as every layer)")

    def _kw(self) -> dict:
        return {"hidden": self.hidden, "gain": self.gain, "hidden_gain": self.hidden_gain or None}

    def modules(self) -> dict[str, MetaNet]:
        """Fresh meta-net modules (structure for `functional_call`; their weights are unused)."""
        nets = {}
        if self.use_bnnet:
            nets["bnnet"] = bnnet(self.num_bn, bias_init=self.bn_bias, **self._kw())
        if self.use_lrnet:
            nets["lrnet"] = lrnet(self.num_layers, self.num_tensors, bias_init=self.lr_bias, max_value=self.lr_max,
                                  **self._kw())
        return nets


def group_of(key: str) -> str:
    """Which of lambda's groups {w_bn, w_lr, eta_tilde} a key of the flat dict belongs to."""
    group = key.split(".", 1)[0]
    if group not in GROUPS:
        raise KeyError(f"{key!r} is not a meta-parameter key (groups: {GROUPS})")
    return group


def init_meta_params(spec: MetaSpec, generator: torch.Generator | None = None,
                     device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """lambda = {w_bn, w_lr, eta_tilde} at their App. D/E initial values (Alg. 1 line 1).

    Drawn on the CPU (a CPU ``generator`` gives the same lambda on every device), then moved
    once to ``device``, where the server keeps it.
    """
    lam: dict[str, torch.Tensor] = {}
    if spec.use_bnnet:
        net = bnnet(spec.num_bn, bias_init=spec.bn_bias, generator=generator, **spec._kw())
        lam.update({f"bnnet.{k}": v.detach().clone() for k, v in net.state_dict().items()})
    if spec.use_lrnet:
        net = lrnet(spec.num_layers, spec.num_tensors, bias_init=spec.lr_bias, max_value=spec.lr_max,
                    generator=generator, **spec._kw())
        lam.update({f"lrnet.{k}": v.detach().clone() for k, v in net.state_dict().items()})
        lam["eta_tilde"] = torch.full((spec.num_tensors,), float(spec.fixed_lr), device="cpu")
    return {k: v.to(device) for k, v in lam.items()}


def meta_hyperparams(spec: MetaSpec, nets: dict[str, MetaNet], lam: dict[str, torch.Tensor], xi: torch.Tensor | None,
                     features: torch.Tensor | None) -> tuple[torch.Tensor | float, torch.Tensor]:
    """Eq. 4: ``beta = BNNet(w_bn; xi)`` and ``eta = LRNet(w_lr; features) * eta_tilde``.

    Differentiable in the tensors of ``lam``. Without BNNet, beta is ``spec.fixed_beta``
    (a float); without LRNet, eta is ``spec.fixed_lr`` for every tensor.

    Args:
        spec: the sizes and switches.
        nets: ``spec.modules()`` (reused across calls).
        lam: the flat meta-parameter dict.
        xi: (B,) KL distances (Eq. 3), or None without BNNet.
        features: (2M,) LRNet inputs, or None without LRNet.

    Returns:
        ``(beta, eta)``: beta a (B,) tensor or a float, eta a (P,) tensor.
    """
    if spec.use_bnnet:
        params = {k[len("bnnet."):]: v for k, v in lam.items() if k.startswith("bnnet.")}
        beta = functional_call(nets["bnnet"], params, (xi.reshape(1, -1),)).reshape(-1)
    else:
        beta = float(spec.fixed_beta)
    if spec.use_lrnet:
        params = {k[len("lrnet."):]: v for k, v in lam.items() if k.startswith("lrnet.")}
        eta = functional_call(nets["lrnet"], params, (features.reshape(1, -1),)).reshape(-1) * lam["eta_tilde"]
    else:
        like = features if features is not None else xi
        eta = torch.full((spec.num_tensors,), float(spec.fixed_lr), device=None if like is None else like.device)
    return beta, eta


def input_sensitivity(spec: MetaSpec, nets: dict[str, MetaNet], lam: dict[str, torch.Tensor],
                      xi: torch.Tensor | None, features: torch.Tensor | None) -> dict[str, float]:
    """How much the meta-nets' outputs move per unit of their inputs, at one client's inputs.

    Returns ``{"bnnet": ||d beta / d xi||_F / sqrt(B), "lrnet": ||d LRNet / d x||_F / sqrt(P)}``
    (the root-mean-square over outputs of the Jacobian rows' norms; LRNet's output before the
    multiplication by eta_tilde). Through the straight-through clamp: the forward values
    are clamped, the Jacobian is that of the unclamped MLP. A diagnostic: under App. E's
    init it is ~1e-4, so inputs that differ by 0.1 give hyperparameters that differ by 1e-5.
    """
    from torch.func import jacrev

    out = {}
    if spec.use_bnnet and xi is not None:
        params = {k[len("bnnet."):]: v.detach() for k, v in lam.items() if k.startswith("bnnet.")}
        jac = jacrev(lambda z: functional_call(nets["bnnet"], params, (z.reshape(1, -1),)).reshape(-1))(xi.detach())
        out["bnnet"] = float(jac.norm() / jac.shape[0] ** 0.5)
    if spec.use_lrnet and features is not None:
        params = {k[len("lrnet."):]: v.detach() for k, v in lam.items() if k.startswith("lrnet.")}
        jac = jacrev(lambda z: functional_call(nets["lrnet"], params, (z.reshape(1, -1),)).reshape(-1))(
            features.detach())
        out["lrnet"] = float(jac.norm() / jac.shape[0] ** 0.5)
    return out
