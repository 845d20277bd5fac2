"""pFedHN's unseen clients (sec. 5.3, Fig. 2): trained on the others, then phi frozen and one embedding
fitted per unseen client; the stage's unseen accuracy is theirs and its report keeps how each fit ended."""
from __future__ import annotations

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.analysis.pfedhn import novel_tv, tv_to_nearest
from pflkit.config import ConfigError
from pflkit.run.experiments import resolve
from pflkit.fl.algorithm import Env
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from pflkit.models import build_model
from pflkit.report.compact import analysis
from pflkit.run.runner import run_experiment
from tests.helpers_data import digits_dataset

PFEDHN = ALGORITHMS["pfedhn"]
UNSEEN = 3


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(), "pathological", 12, seed=0, classes_per_client=2,
                            unseen_clients=UNSEEN, unseen_pick="last")


@pytest.fixture(scope="module")
def trained(fed):
    env = Env(model_fn=lambda: build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=(16,)), seed=0)
    cfg = PFEDHN.make_config({"rounds": 12, "fraction": 0.2, "local_steps": 2, "eval_every": 0, "lr": 0.05,
                              "hidden": 12, "depth": 2, "novel_max_steps": 6})
    env.seed_torch("init")
    result = run_rounds(PFEDHN, cfg, fed, env.model_fn(), env)
    env.seed_torch("init")
    initial = PFEDHN.init(env.model_fn(), fed, cfg, env)
    return result, PFEDHN.fit_unseen(result, fed, cfg, env), initial, cfg, env


def test_unseen_pick_last_takes_the_last_ids_and_random_keeps_its_recipe(fed):
    assert fed.unseen_ids == [9, 10, 11] and fed.seen_ids == list(range(9))
    other = build_federation(digits_dataset(), "pathological", 12, seed=0, classes_per_client=2, unseen_clients=UNSEEN)
    assert "unseen_pick" not in other.recipe and other.unseen_ids != fed.unseen_ids


def test_training_never_moves_an_unseen_row_and_the_fit_moves_only_those(trained, fed):
    result, fitted, initial, _, _ = trained
    seen, unseen = torch.tensor(fed.seen_ids), torch.tensor(fed.unseen_ids)
    before, after = result.state["hnet"]["embeddings"], fitted.state["hnet"]["embeddings"]
    # no gradient reached them: only the server optimizer's weight decay (on every row, as the authors' SGD
    # on their nn.Embedding) shrank them, by one factor
    ratio = before[unseen] / initial["hnet"]["embeddings"][unseen]
    assert torch.allclose(ratio, ratio[0, 0], rtol=1e-5) and 0.99 < ratio[0, 0] < 1
    assert not torch.equal(before[seen], initial["hnet"]["embeddings"][seen])
    assert torch.equal(after[seen], before[seen])
    assert not torch.allclose(after[unseen], before[seen].mean(0).expand(UNSEEN, -1))  # fitted from the mean
    for name, tensor in result.state["hnet"].items():  # phi frozen
        if name != "embeddings":
            assert torch.equal(fitted.state["hnet"][name], tensor), name


def test_unseen_metrics_are_the_fitted_models_and_seen_ones_stay(trained, fed):
    result, fitted, _, cfg, env = trained
    for cid in fed.seen_ids:
        assert fitted.per_client[cid] == result.per_client[cid]
    for cid in fed.unseen_ids:
        again = PFEDHN.evaluate(fitted.state, fed.clients[cid], fitted.client_states[cid], cfg, env, "test")
        assert fitted.per_client[cid]["acc"] == pytest.approx(again["acc"])
    fits = fitted.state["novel_fit"]
    assert [f["client"] for f in fits] == fed.unseen_ids and all(1 <= f["steps"] <= 6 for f in fits)


def test_tv_from_histograms_equals_the_federations():
    full = build_federation(digits_dataset(), "pathological", 12, seed=0, classes_per_client=2)
    train, novel = full.subset(range(9)), full.subset(range(9, 12))
    h = full.histograms("train")
    for basis in ("p_hat", "labels"):
        tv, nearest = novel_tv(train, novel, basis=basis)
        tv2, nearest2 = tv_to_nearest(h[:9], h[9:], basis=basis)
        assert tv == pytest.approx(tv2) and list(nearest) == list(nearest2)


def test_flower_refuses_unseen_pfedhn_before_any_work(tmp_path):
    from pflkit.flower.serve import flower_trainer

    cfg = resolve("pfedhn_fig2_novel", "smoke")
    with pytest.raises(ConfigError, match="data.unseen_clients=3"):
        run_experiment(cfg, tmp_path, progress=False, trainer=flower_trainer(None))


@pytest.mark.needs_data(experiments=["pfedhn_fig2_novel"])
def test_fig2_row_reports_the_novel_clients(tmp_path):
    cfg = resolve("pfedhn_fig2_novel", "smoke")
    res = run_experiment(cfg, tmp_path, progress=False, engine="sequential")
    method = res["methods"]["pFedHN"]
    novel = analysis(tmp_path, res)["pFedHN"]["seeds"][0]["novel"]
    assert novel["clients"] == [7, 8, 9] and len(novel["train_histograms"]) == 10
    assert all(1 <= s <= 10 for s in novel["steps"])
    accs = [method["per_client"][0][c] for c in novel["clients"]]
    assert method["unseen"]["acc_mean"] == pytest.approx(sum(accs) / 3)
