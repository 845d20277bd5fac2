"""FedL2P's outer losses (pflkit.meta.objectives): L_T through the last fine-tuning step
(Eq. 9-10) against dense computations, FOMAML+ (App. F), and the step on lambda (Alg. 1 line 10)."""
import pytest
import torch

from pflkit.meta import objectives
from pflkit.meta.functional import finetune, forward, model_tensors, validation_loss
from pflkit.meta.hypergrad import fomaml_plus, ift_hypergrad
from pflkit.meta.linear_solve import neumann
from pflkit.models.mixed_bn import reset_client_stats

D = torch.float64
PSI, Q = 0.1, 3


@pytest.fixture(scope="module")
def tuned(tiny_bn_net):
    """A fine-tuned tiny net (3 steps, per-tensor eta, beta = 0.6) with its last step kept."""
    model = tiny_bn_net()
    reset_client_stats(model)
    g = torch.Generator().manual_seed(1)
    x, xv = torch.randn(32, 3, generator=g, dtype=D) + 0.4, torch.randn(12, 3, generator=g, dtype=D) + 0.4
    w = torch.randn(3, 3, generator=g, dtype=D)
    y, yv = (x @ w).argmax(1), (xv @ w).argmax(1)
    params, buffers = model_tensors(model)
    names = list(params)
    eta = torch.linspace(0.2, 0.9, len(names), dtype=D)
    beta = torch.tensor([0.6], dtype=D)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in (0, 8, 16)]
    theta, stats = finetune(model, params, buffers, batches, eta, beta, keep_last=True)
    return dict(model=model, names=names, buffers=buffers, theta=theta, last=stats["last"], eta=eta, beta=beta,
                batches=batches, loss_b=(x[24:], y[24:]), val_b=(xv, yv), fresh_b=(x[:8] * 1.3 - 0.2, y[:8]))


def _flat(ts):
    return torch.cat([t.reshape(-1) for t in ts])


def _unflat(v, like):
    out, j = [], 0
    for t in like:
        out.append(v[j:j + t.numel()].reshape(t.shape))
        j += t.numel()
    return out


def _losses(t, lt_mode):
    return objectives.meta_losses(t["model"], t["names"], lambda lm: (lm[0], lm[1]), t["buffers"], t["val_b"],
                                  lt_mode=lt_mode, loss_b=t["loss_b"], step_b=t["fresh_b"], grads=t["last"]["grads"])


def _val_grads(t, theta):
    """d L_V / d theta and d L_V / d beta at (theta, beta) (L_V in evaluation mode)."""
    th = [p.detach().clone().requires_grad_(True) for p in theta]
    beta = t["beta"].clone().requires_grad_(True)
    lv = validation_loss(t["model"], dict(zip(t["names"], th)), t["buffers"], t["val_b"], beta)
    *v, d_beta = torch.autograd.grad(lv, th + [beta])
    return v, d_beta


def test_last_step_is_kept_and_reproduces_the_fine_tuned_weights(tuned):
    last, eta = tuned["last"], tuned["eta"]
    assert all(torch.equal(a, b) for a, b in zip(last["batch"], tuned["batches"][-1]))
    # theta_i = theta_{N-1} - eta * g with the very op of `finetune`
    for (n, p), g, e in zip(last["params"].items(), last["grads"], eta.tolist()):
        assert torch.equal(torch.add(p, g, alpha=-e), tuned["theta"][n])


def test_ift_hypergradient_is_the_last_step_definition_in_eval_mode(tuned):
    """Alg. 2 (Q = 3, psi = 0.1) against a dense computation of the authors' L_T.

    L_T = CE in evaluation mode on the loss batch at theta' = theta_{N-1} - eta g (g the last
    fine-tuning step's gradient), so at theta_i: H = d^2 CE_eval, d_beta d_theta L_T explicit, and
    d_eta_k d_theta L_T = -H g_k. Hence, with p = sum_j (I - psi H)^j v, v = d L_V / d theta:
    beta: d_beta L_V - p^T d_beta d_theta CE_eval;  eta_k: (H p)_k . g_k.
    """
    t = tuned
    theta = [t["theta"][n] for n in t["names"]]
    train_loss, val_loss, _ = _losses(t, "last_step")
    got_beta, got_eta = ift_hypergrad(train_loss, val_loss, theta, [t["beta"], t["eta"]],
                                      solve=lambda mv, b: neumann(mv, b, steps=Q, psi=PSI, scaled=False))

    def ce(flat, beta, training=False):
        params = dict(zip(t["names"], _unflat(flat, theta)))
        if training:
            bufs = {k: b.clone() for k, b in t["buffers"].items()}
            out = forward(t["model"], params, bufs, t["loss_b"][0], beta=beta, training=True)
            return torch.nn.functional.cross_entropy(out, t["loss_b"][1])
        return validation_loss(t["model"], params, t["buffers"], t["loss_b"], beta)

    def expected(training):
        flat0 = _flat(theta).detach()
        hess = torch.autograd.functional.hessian(lambda f: ce(f, t["beta"], training), flat0)
        mixed = torch.autograd.functional.jacobian(lambda b: _grad_theta(ce, flat0, b, training), t["beta"])
        v, d_beta = _val_grads(t, theta)
        v = _flat(v)
        p, term = v.clone(), v.clone()
        for _ in range(Q):
            term = term - PSI * hess @ term
            p = p + term
        hp = _unflat(hess @ p, theta)
        eta_k = torch.stack([(a * g).sum() for a, g in zip(hp, t["last"]["grads"])])
        return d_beta - mixed.T @ p, eta_k

    want_beta, want_eta = expected(training=False)
    torch.testing.assert_close(got_eta, want_eta, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_beta, want_beta, rtol=1e-9, atol=1e-12)
    assert want_eta.abs().min() > 1e-6 and want_beta.abs().min() > 1e-6  # the comparison is informative
    # the BN mode matters: the same computation in training mode gives another beta gradient
    assert not torch.allclose(got_beta, expected(training=True)[0], rtol=1e-3)


def _grad_theta(ce, flat0, beta, training):
    f = flat0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(ce(f, beta, training), f, create_graph=True)
    return g


def test_the_earlier_lookahead_loss_gives_another_eta_hypergradient(tuned):
    t = tuned
    theta = [t["theta"][n] for n in t["names"]]
    solve = lambda mv, b: neumann(mv, b, steps=Q, psi=PSI, scaled=False)  # noqa: E731
    new = ift_hypergrad(*_losses(t, "last_step")[:2], theta, [t["beta"], t["eta"]], solve=solve)
    old = ift_hypergrad(*_losses(t, "lookahead")[:2], theta, [t["beta"], t["eta"]], solve=solve)
    assert not torch.allclose(new[1], old[1], rtol=1e-2)


def test_fomaml_plus_differentiates_through_the_last_fine_tuning_step(tuned):
    """FOMAML+ (App. F): d/d lambda L_V(theta_{N-1} - eta g, beta): beta directly, eta_k = -v_k . g_k."""
    t = tuned
    theta = [t["theta"][n] for n in t["names"]]
    _, val_loss, step = _losses(t, "last_step")
    got_beta, got_eta = fomaml_plus(val_loss, step, theta, [t["beta"], t["eta"]])
    v, d_beta = _val_grads(t, theta)
    want_eta = torch.stack([-(a * g).sum() for a, g in zip(v, t["last"]["grads"])])
    torch.testing.assert_close(got_eta, want_eta, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(got_beta, d_beta, rtol=1e-10, atol=1e-14)
    # and by central differences of L_V after the last step taken with eta + h e_k
    start, grads = list(t["last"]["params"].values()), t["last"]["grads"]
    h = 1e-6
    for k in (0, len(theta) - 1):
        vals = []
        for s in (h, -h):
            th = [p - (e + (s if j == k else 0.0)) * g for j, (p, g, e) in enumerate(zip(start, grads, t["eta"]))]
            vals.append(float(val_loss(th, [t["beta"], t["eta"]])))
        assert float(got_eta[k]) == pytest.approx((vals[0] - vals[1]) / (2 * h), rel=1e-6)


# ------------------------------------------------------------------ the step on lambda

def test_lambda_step_clips_then_steps_each_group_with_its_rate():
    """Alg. 1 line 10 by hand: zeta = (w_bn, w_lr, eta_tilde) rates, gradients clipped by value first."""
    lam = {"bnnet.w": torch.tensor([1.0, 2.0]), "lrnet.w": torch.tensor([0.5]),
           "eta_tilde": torch.tensor([0.1, 0.2, 0.3], requires_grad=True)}
    grads = [torch.tensor([3.0, -0.5]), torch.tensor([-2.0]), torch.tensor([0.4, -0.4, 10.0])]
    new = objectives.lambda_step(lam, grads, (0.1, 0.01, 0.001), clip=1.0)
    torch.testing.assert_close(new["bnnet.w"], torch.tensor([1.0 - 0.1 * 1.0, 2.0 + 0.1 * 0.5]))
    torch.testing.assert_close(new["lrnet.w"], torch.tensor([0.5 + 0.01 * 1.0]))
    torch.testing.assert_close(new["eta_tilde"], torch.tensor([0.1 - 0.0004, 0.2 + 0.0004, 0.3 - 0.001]))
    assert list(new) == list(lam) and not new["eta_tilde"].requires_grad
    unclipped = objectives.lambda_step(lam, grads, (0.1, 0.01, 0.001), clip=0.0)
    torch.testing.assert_close(unclipped["bnnet.w"], torch.tensor([1.0 - 0.3, 2.0 + 0.05]))
