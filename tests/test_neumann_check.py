"""pflkit.batch.neumann_check: the power iteration and Neumann terms against exact linear algebra, the
unrolled hypergradient against finite differences in float64, the check's meta step against
`fedl2p_client.meta_step` itself, and the whole check on a saved run through the CLI."""
import argparse
import dataclasses
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers_data import digits_dataset, digits_env  # noqa: E402

from pflkit.batch import neumann_check as nc  # noqa: E402
from pflkit.algorithms import fedl2p  # noqa: E402
from pflkit.algorithms import fedl2p_client as fc  # noqa: E402
from pflkit.algorithms.fedl2p import FEDL2P  # noqa: E402
from pflkit.cli import _setting, main  # noqa: E402
from pflkit.data.datasets import load_dataset  # noqa: E402
from pflkit.run.experiments import resolve  # noqa: E402
from pflkit.fl.federation import Client, Federation  # noqa: E402
from pflkit.fl.train import get_state, set_state  # noqa: E402
from pflkit.io import load_torch  # noqa: E402
from pflkit.meta.hypergrad import _grads, fomaml_plus, ift_hypergrad, leaves  # noqa: E402
from pflkit.meta.metanets import init_meta_params  # noqa: E402
from pflkit.meta.objectives import lambda_step  # noqa: E402
from pflkit.models import build_model  # noqa: E402
from pflkit.run.environment import initial_model, make_env
from pflkit.run.runner import run_experiment  # noqa: E402
from pflkit.run.stages import method_config  # noqa: E402

SMALL = {"rounds": 1, "fraction": 1.0, "epochs": 1, "meta_iters": 1, "lr": 0.05, "batch_size": 16}


def _operator(eigenvalues, seed=0):
    """A symmetric matrix with the given spectrum, as a matvec on a list of two tensors."""
    n = len(eigenvalues)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    a = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
    cut = n // 2

    def matvec(u):
        y = a @ torch.cat([t.reshape(-1) for t in u])
        return [y[:cut], y[cut:]]
    return a, matvec, [torch.zeros(cut, dtype=torch.float64), torch.zeros(n - cut, dtype=torch.float64)]


@pytest.mark.parametrize("spectrum", [[0.5, 2.0, 3.0, 9.0, 1.0], [-7.0, 1.0, 2.0, 3.0, 0.1, 4.0]])
def test_largest_eigenvalue_is_the_signed_eigenvalue_of_largest_magnitude(spectrum):
    a, matvec, like = _operator(spectrum)
    exact = torch.linalg.eigvalsh(a)
    want = float(exact[exact.abs().argmax()])
    got = nc.largest_eigenvalue(matvec, like, steps=200, generator=torch.Generator().manual_seed(1))
    assert got == pytest.approx(want, rel=1e-6)


def test_largest_eigenvalue_rejects_no_steps():
    _, matvec, like = _operator([1.0, 2.0])
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        nc.largest_eigenvalue(matvec, like, steps=0)


def test_neumann_terms_are_the_powers_of_i_minus_psi_a():
    spectrum = [0.5, 4.0, 30.0]  # psi = 0.1: 30 lies outside (0, 20), so its component grows by |1 - 3| = 2
    a, matvec, _ = _operator(spectrum, seed=3)
    b = [torch.ones(1, dtype=torch.float64), torch.ones(2, dtype=torch.float64)]
    terms = nc.neumann_terms(matvec, b, steps=4, psi=0.1)
    flat = torch.ones(3, dtype=torch.float64)
    m = torch.eye(3, dtype=torch.float64) - 0.1 * a
    want = [float(torch.linalg.matrix_power(m, j) @ flat @ (torch.linalg.matrix_power(m, j) @ flat)) ** 0.5
            for j in range(5)]
    assert terms == pytest.approx(want, rel=1e-10)
    # eigen-coordinates: the divergent direction doubles each term, the others shrink
    w, v = torch.linalg.eigh(a)
    coeff = v.T @ flat
    assert terms[4] == pytest.approx(float(((1 - 0.1 * w) ** 4 * coeff).norm()), rel=1e-10)
    assert terms[4] / terms[3] == pytest.approx(2.0, rel=0.05)


class _DoubleClient(Client):
    """A client whose batches come in float64 (the finite-difference test)."""

    def batches(self, *args, **kwargs):
        for x, y in super().batches(*args, **kwargs):
            yield x.double(), y

    def random_batch(self, *args, **kwargs):
        x, y = super().random_batch(*args, **kwargs)
        return x.double(), y


def _client(n_train=48, n_val=32, double=False):
    ds = digits_dataset(200)
    splits = {"train": np.arange(n_train), "val": np.arange(n_train, n_train + n_val), "test": np.arange(150, 170)}
    return (_DoubleClient if double else Client)(0, ds.x_train, ds.y_train, splits, ds.meta)


def _to_double(ctx):
    """The client's statistics in float64 (they are computed in float32)."""
    ctx.stats.xi, ctx.stats.features = ctx.stats.xi.double(), ctx.stats.features.double()
    for name, b in ctx.buffers.items():
        if b.is_floating_point():
            ctx.buffers[name] = b.double()


def _setup(cfg_changes=None, double=False):
    env = digits_env(seed=5)
    env.seed_torch("pretrained")
    weights = get_state(env.model_fn())
    cfg = FEDL2P.make_config({**SMALL, **(cfg_changes or {})})
    client = _client(double=double)
    ctx = fc.prepare_client(weights, client, cfg, env)
    if double:
        _to_double(ctx)
    lam = init_meta_params(ctx.spec, env.generator("fedl2p", "init"))
    val_b = next(iter(fc.val_schedule(client, cfg, env.generator("fedl2p-val", client.id, env.round), ctx.device)))
    return env, cfg, ctx, lam, val_b


def _meta_learn_generator(env, ctx):
    # the generator fc.meta_learn hands its first meta step, written out here
    return env.generator("fedl2p", ctx.client.id, env.round, 0)


@pytest.mark.parametrize("changes", [{}, {"lt_mode": "lookahead"}, {"meta_grad": "fomaml"}])
def test_the_checked_step_is_meta_step_itself(changes):
    env, cfg, ctx, lam, val_b = _setup(changes)
    losses, th, lm = nc._problem(ctx, env, lam, cfg, 0, val_b)
    grads = fc._hypergradient(cfg, losses, th, lm)
    new, row = fc.meta_step(ctx, lam, cfg, _meta_learn_generator(env, ctx), val_batch=val_b)
    mine = lambda_step(lam, grads, cfg.zeta, cfg.clip)
    assert all(torch.equal(mine[k], new[k]) for k in new)
    assert nc._val_loss(ctx, env, lam, cfg, 0, val_b) == row["val_loss"]
    assert not all(torch.equal(new[k], lam[k]) for k in lam)  # the step moved lambda: the comparison has teeth


def test_unrolled_hypergradient_matches_finite_differences_in_float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        env, cfg, ctx, lam, val_b = _setup({"epochs": 2}, double=True)
        assert all(t.dtype == torch.float64 for t in lam.values())
        exact = nc.unrolled_hypergradient(ctx, env, lam, cfg, 0, val_b)
        keys = list(lam)
        gen = torch.Generator().manual_seed(0)
        for group in ("bnnet", "lrnet", "eta_tilde", None):
            d = {k: (torch.randn(v.shape, generator=gen, dtype=v.dtype) if group in (None, k.split(".")[0])
                     else torch.zeros_like(v)) for k, v in lam.items()}
            eps = 1e-7  # L_V has kinks (ReLU, clamps) within 1e-5 of lambda here: a small step in float64
            up = nc._val_loss(ctx, env, {k: lam[k] + eps * d[k] for k in keys}, cfg, 0, val_b)
            down = nc._val_loss(ctx, env, {k: lam[k] - eps * d[k] for k in keys}, cfg, 0, val_b)
            fd = (up - down) / (2 * eps)
            analytic = sum(float((g * d[k]).sum()) for k, g in zip(keys, exact))
            assert abs(analytic) > 1e-6, group
            assert analytic == pytest.approx(fd, rel=1e-5), group
    finally:
        torch.set_default_dtype(old)


def test_the_step_check_reports_what_it_measured():
    env, cfg, ctx, lam, val_b = _setup()
    row = nc.fedl2p_step_check(ctx, env, lam, cfg, val_b, power_steps=20)
    assert row["psi_lam_max"] == pytest.approx(cfg.psi * row["lam_max"])
    assert len(row["terms"]) == cfg.neumann_steps + 1
    assert row["val_loss"] == nc._val_loss(ctx, env, lam, cfg, 0, val_b)
    # the run's step, re-evaluated on the same batches, is what meta_step's next L_V would see
    new, _ = fc.meta_step(ctx, lam, cfg, _meta_learn_generator(env, ctx), val_batch=val_b)
    assert row["val_loss_step"] == nc._val_loss(ctx, env, new, cfg, 0, val_b)
    assert -1 <= row["cosine"] <= 1 and set(row["cosine_group"]) == {"bnnet", "lrnet", "eta_tilde"}
    assert 0 <= row["clipped"] <= 1 and all(v > 0 for v in row["grad_norm"].values())


TINY_TOML = """
[experiment]
name = "tiny-fedl2p"
[data]
dataset = "digits"
num_clients = 3
scheme = "iid"
split = "pool"
test_fraction = 0.2
val_fraction = 0.2
[model]
name = "digits_cnn"
options = { channels = [4, 8, 8] }
[pretrain]
label = "Global"
algorithm = "fedavg"
rounds = 1
fraction = 1.0
lr = 0.05
batch_size = 16
[methods."FedL2P"]
algorithm = "fedl2p"
rounds = 1
fraction = 1.0
epochs = 1
meta_iters = 1
lr = 0.05
batch_size = 16
"""


def _spec() -> dict:
    """The tiny experiment as a dict (the same text as the file the command reads)."""
    return tomllib.loads(TINY_TOML)


@pytest.fixture
def saved_run(tmp_path):
    spec = _spec()
    out = tmp_path / "run"
    run_experiment(resolve(spec, "smoke"), out, progress=False)
    return spec, out


def test_run_step_check_on_a_saved_run(saved_run):
    spec, out = saved_run
    rows = nc.run_step_check(spec, out, preset="smoke", clients=2, power_steps=10)
    assert [r["client"] for r in rows] == [0, 1]
    again = nc.run_step_check(spec, out, preset="smoke", clients=2, power_steps=10, changes={"psi": 0.01})
    assert [r["psi"] for r in again] == [0.01, 0.01]
    # the same fine-tuning and batches: L_V before the step does not depend on psi, the terms do
    assert [r["val_loss"] for r in again] == [r["val_loss"] for r in rows]
    assert [r["terms"][1] for r in again] != [r["terms"][1] for r in rows]
    table = nc.format_rows(rows)
    assert table.count("\n") == 4 and "(0, 20)" in table  # 2 lines of legend, the head, 2 rows


def _initial_lambda(spec, out):
    """Alg. 1 line 1's lambda of the saved run (what `run_step_check` starts from)."""
    exp = resolve(spec, "smoke")
    fed = Federation.load(out / "seed0" / "federation.npz", load_dataset("digits"))
    env = make_env(exp, fed, 0)
    model = set_state(initial_model(env), load_torch(out / "seed0" / "global.weights.pt"))
    return fedl2p.init(model, fed, method_config(exp, "FedL2P")[1], env)["lam"]


def test_run_step_check_at_a_checkpoint_lambda(saved_run, tmp_path):
    """The lambda of a stage checkpoint (last or kept) replaces the initial one, and the step is the next round's."""
    spec, out = saved_run
    plain = nc.run_step_check(spec, out, preset="smoke", clients=1, power_steps=5)
    start = _initial_lambda(spec, out)
    moved = {k: v + 0.05 for k, v in start.items()}
    ck = tmp_path / "fedl2p.ckpt"
    torch.save({"round": 0, "state": {"lam": moved}, "best": (0.5, 0, {"lam": start})}, ck)
    kept = nc.run_step_check(spec, out, preset="smoke", clients=1, power_steps=5, checkpoint=ck, kept=True)
    last = nc.run_step_check(spec, out, preset="smoke", clients=1, power_steps=5, checkpoint=ck)
    assert kept[0]["val_loss"] == plain[0]["val_loss"] and kept[0]["cosine"] == plain[0]["cosine"]
    assert last[0]["val_loss"] != plain[0]["val_loss"]  # the moved lambda fine-tunes otherwise
    torch.save({"round": 2, "state": {"lam": start}, "best": None}, ck)
    later = nc.run_step_check(spec, out, preset="smoke", clients=1, power_steps=5, checkpoint=ck)
    assert later[0]["val_loss"] != plain[0]["val_loss"]  # round 3's batches, not round 1's


def test_run_step_check_refuses_bad_input_before_work(tmp_path, saved_run):
    spec, out = saved_run
    with pytest.raises(ValueError, match="clients must be an integer >= 1, got 0"):
        nc.run_step_check(spec, out, preset="smoke", clients=0)
    with pytest.raises(FileNotFoundError, match="federation.npz is missing"):
        nc.run_step_check(spec, tmp_path / "nothing", preset="smoke")
    plain = {**spec, "methods": {"FedAvg": {"algorithm": "fedavg", "rounds": 1}}}
    with pytest.raises(ValueError, match="has no FedL2P method"):
        nc.run_step_check(plain, out, preset="smoke")
    with pytest.raises(Exception, match="psi"):
        nc.run_step_check(spec, out, preset="smoke", changes={"psi": -1.0})
    with pytest.raises(ValueError, match="kept=True needs a checkpoint"):
        nc.run_step_check(spec, out, preset="smoke", kept=True)
    junk = tmp_path / "junk.ckpt"
    torch.save({"round": 1}, junk)
    with pytest.raises(ValueError, match="junk.ckpt: not a FedL2P stage checkpoint with a lambda"):
        nc.run_step_check(spec, out, preset="smoke", checkpoint=junk)
    torch.save({"round": 1, "state": {"lam": {"eta_tilde": torch.zeros(2)}}}, junk)
    with pytest.raises(ValueError, match="its lambda does not fit 'tiny-fedl2p'"):
        nc.run_step_check(spec, out, preset="smoke", checkpoint=junk)


def test_the_command_prints_and_writes_the_check(saved_run, tmp_path, capsys):
    spec, out = saved_run
    toml = tmp_path / "tiny.toml"
    toml.write_text(TINY_TOML)
    assert resolve(toml, "smoke").to_dict() == resolve(spec, "smoke").to_dict()  # the file is the fixture's run
    rows = tmp_path / "rows.json"
    assert main(["check-hypergradient", str(toml), "--run", str(out), "--preset", "smoke", "--clients", "1",
                 "--power-steps", "5", "--set", "psi=0.05", "--json", str(rows)]) == 0
    printed = capsys.readouterr().out
    assert "psi = 0.05" in printed and "(0, 40)" in printed
    assert [r["psi"] for r in json.loads(rows.read_text())] == [0.05]
    assert main(["check-hypergradient", str(toml), "--run", str(tmp_path / "none"), "--preset", "smoke"]) == 2
    assert "federation.npz is missing" in capsys.readouterr().err
    assert _setting("meta_grad=fomaml") == ("meta_grad", "fomaml") and _setting("lt_mode='lookahead'")[1] == "lookahead"
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE, got 'psi'"):
        _setting("psi")


def test_with_an_exact_solve_the_ift_learning_rate_hypergradient_is_minus_fomaml_plus():
    """Eq. 9-10's L_T (``lt_mode="last_step"``) makes the IFT's d theta* / d eta_k = +g_k, while the
    last fine-tuning step moves the weights by -g_k: with H^{-1} exact, the IFT gradient of LRNet and
    eta_tilde is FOMAML+'s with the sign flipped. A model of 132 weights, so H is solved densely."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        env = digits_env(seed=5)
        env = dataclasses.replace(env, model_fn=lambda: build_model("digits_cnn", num_classes=10,
                                                                    input_shape=(1, 8, 8), channels=[2, 2, 2]))
        env.seed_torch("pretrained")
        weights = get_state(env.model_fn())
        cfg = FEDL2P.make_config(SMALL)
        client = _client(double=True)
        ctx = fc.prepare_client(weights, client, cfg, env)
        _to_double(ctx)
        lam = init_meta_params(ctx.spec, env.generator("fedl2p", "init"))
        val_b = next(iter(fc.val_schedule(client, cfg, env.generator("fedl2p-val", 0, env.round), ctx.device)))
        (train_loss, val_loss, step), th, lm = nc._problem(ctx, env, lam, cfg, 0, val_b)
        x = leaves(th)
        dt = _grads(train_loss(x, leaves(lm)), x, create_graph=True)
        sizes = [t.numel() for t in x]
        eye = torch.eye(sum(sizes))
        hessian = torch.stack([torch.cat([h.reshape(-1) for h in _grads(
            dt, x, [c.reshape(t.shape) for c, t in zip(torch.split(col, sizes), x)], retain_graph=True)])
            for col in eye], 1)
        v = torch.cat([g.reshape(-1) for g in _grads(val_loss(x, leaves(lm)), x)])
        p = torch.linalg.solve(hessian, v)
        assert float((hessian @ p - v).norm()) < 1e-10 * float(v.norm())

        def exact(matvec, b):
            return [c.reshape(t.shape) for c, t in zip(torch.split(p, sizes), b)]
        ift = ift_hypergrad(train_loss, val_loss, th, lm, solve=exact)
        first_order = fomaml_plus(val_loss, step, th, lm)
        for key, a, b in zip(lam, ift, first_order):
            if key.startswith(("lrnet.", "eta_tilde")):
                assert torch.allclose(a, -b, rtol=1e-8, atol=1e-12), key
        assert float(torch.cat([g.reshape(-1) for g in ift]).norm()) > 1e-4
    finally:
        torch.set_default_dtype(old)
