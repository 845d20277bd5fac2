"""FedL2P end to end learns the same lambda with the reference ops and the Triton kernels.

The Triton kernels run through Triton's interpreter on this CPU (TRITON_INTERPRET=1, set in
tests/conftest.py); on a GPU machine the same test runs them compiled.
"""
import pytest
import torch

from pflkit import kernels
from pflkit.algorithms import ALGORITHMS
from pflkit.data.base import Dataset
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from tests.helpers_data import digits_dataset, digits_env

FEDL2P = ALGORITHMS["fedl2p"]


def _learn(backend: str):
    full = digits_dataset()
    tiny = Dataset(full.meta, full.x_train[:160], full.y_train[:160], full.x_test[:0], full.y_test[:0])
    fed = build_federation(tiny, "dirichlet", 2, seed=0, alpha=0.5)
    env = digits_env()
    env.seed_torch("init")
    model = env.model_fn()
    cfg = FEDL2P.make_config({"rounds": 1, "fraction": 1.0, "epochs": 1, "meta_iters": 1, "batch_size": 64,
                              "lr": 0.01, "keep_best": False})
    with kernels.use_backend(backend):
        res = run_rounds(FEDL2P, cfg, fed, model, env, test=False)
    return res.state["lam"]


@pytest.mark.skipif(not kernels.triton_importable(), reason="triton is not installed")
def test_same_lambda_with_reference_and_triton_ops():
    if not kernels.is_available("mixed_batch_norm"):
        pytest.skip("the Triton mixed-BN op cannot run here (no CUDA and no TRITON_INTERPRET)")
    ref, tri = _learn("reference"), _learn("triton")
    init = FEDL2P.init(digits_env().model_fn(), None, FEDL2P.make_config({}), digits_env())["lam"]
    moved = max(float((ref[k] - init[k]).abs().max()) for k in ref)
    assert moved > 0, "lambda did not move: the comparison would be vacuous"
    for k in ref:
        torch.testing.assert_close(tri[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)
