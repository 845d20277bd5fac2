"""FedSelect: GradLTN's mask schedule, frozen entries, LocalAlt, the masked server of Alg. 2."""
import math

import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.fedselect import (
    FEDSELECT, FEDSELECT_V2, aggregate, alt_schedule, broadcast, decode_mask, eligible_names, encode_mask, filled,
    grad_ltn, keep_largest, local_alt, mask_report, masked_sgd, personalized_state, receive, to_sparse,
)
from pflkit.config import ConfigError
from pflkit.fl.algorithm import Env, Update
from pflkit.fl.engines import nbytes
from pflkit.fl.loop import run_rounds
from pflkit.fl.train import get_state
from pflkit.models import build_model
from tests.algorithms.conftest import shards_fed
from tests.helpers_data import digits_env


@pytest.fixture(scope="module")
def fed():
    return shards_fed(4)


def _cfg(algo=FEDSELECT, **kw):
    base = {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3, "batch_size": 10, "ltn_iterations": 3,
            "ltn_epochs": 1, "local_epochs": 1, "rounds": 2, "eval_every": 0, "keep_best": False}
    return algo.make_config({**base, **kw})


def _model(env):
    env.seed_torch("init")
    return env.scratch_model()


@pytest.mark.parametrize("p, ranking", [(0.5, "global"), (0.25, "layer")])
def test_frozen_set_grows_by_one_minus_p_per_iteration_and_never_shrinks(fed, p, ranking):
    """m_i keeps round(p * |m_{i-1}|) of the previous candidates, the ones that moved most."""
    env = digits_env()
    model = _model(env)
    cfg = _cfg(personalization_rate=p, ranking=ranking)
    res = grad_ltn(model, fed.clients[0], cfg, env, keep_trace=True)
    names = eligible_names(model)
    assert len(res.trace) == cfg.ltn_iterations + 1
    for (prev, _), (cur, delta) in zip(res.trace, res.trace[1:]):
        groups = [names] if ranking == "global" else [[n] for n in names]
        for g in groups:
            n_prev = sum(int(prev[n].sum()) for n in g)
            n_cur = sum(int(cur[n].sum()) for n in g)
            assert n_cur == max(1, round(p * n_prev))
            kept = torch.cat([delta[n][cur[n]] for n in g])
            dropped = torch.cat([delta[n][prev[n] & ~cur[n]] for n in g])
            if len(dropped):
                assert kept.min() >= dropped.max()
        for n in names:  # nested: a frozen entry never becomes trainable again
            assert not (cur[n] & ~prev[n]).any()
    assert all(torch.equal(res.mask[n], res.trace[-1][0][n]) for n in names)
    assert res.mask.keys() == set(names)


def test_theta0_start_and_split_into_shared_and_personal(fed):
    env = digits_env()
    model = _model(env)
    theta0 = get_state(model)
    res = grad_ltn(model, fed.clients[1], _cfg(), env)
    for k, v in theta0.items():
        assert torch.equal(res.start[k], v) and torch.equal(model.state_dict()[k], v)
    for n, m in res.mask.items():
        assert torch.equal(res.shared[n] + res.personal[n], theta0[n])
        assert not res.shared[n][m].any() and not res.personal[n][~m].any()


def test_frozen_entries_do_not_move_during_gradltn(fed):
    """FedSelectv2 returns theta_L: trained only inside m_L, bitwise theta_0 outside (momentum + wd on)."""
    env = digits_env()
    model = _model(env)
    theta0 = get_state(model)
    res = grad_ltn(model, fed.clients[2], _cfg(FEDSELECT_V2), env)
    moved = 0
    for n, m in res.mask.items():
        assert torch.equal(res.start[n][~m], theta0[n][~m]), n
        moved += int((res.start[n][m] != theta0[n][m]).sum())
    assert moved > 0.5 * sum(int(m.sum()) for m in res.mask.values())


def test_local_alt_passes_move_only_their_part(fed):
    env = digits_env()
    model = _model(env)
    cfg = _cfg(local_epochs=2)  # one personal pass, then one shared pass
    gen = torch.Generator().manual_seed(0)
    personal = {n: torch.rand(p.shape, generator=gen) < 0.3 for n, p in model.named_parameters()}
    shared = {n: ~m for n, m in personal.items()}
    for active in (personal, shared):
        before = get_state(model)
        masked_sgd(model, fed.clients[0], active, cfg, env, 1, ("test",))
        after = get_state(model)
        for n, m in active.items():
            assert torch.equal(after[n][~m], before[n][~m]), n
        assert any(not torch.equal(after[n][m], before[n][m]) for n, m in active.items())
    before = get_state(model)
    stats = local_alt(model, fed.clients[0], personal, cfg, env)
    assert math.isfinite(stats["loss"])
    after = get_state(model)
    assert all(any((after[n] != before[n])[m].any() for n, m in part.items()) for part in (personal, shared))


def test_alt_schedule_by_hand():
    """"5 epochs of LocalAlt": 5 passes alternating personal / shared, or (authors' code) 5 pairs."""
    assert [part for _, part in alt_schedule(5, "pass")] == ["personal", "shared"] * 2 + ["personal"]
    assert [part for _, part in alt_schedule(2, "pair")] == ["personal", "shared"] * 2
    assert [key for key, _ in alt_schedule(2, "pair")] == [("alt", 0, "personal"), ("alt", 0, "shared"),
                                                          ("alt", 1, "personal"), ("alt", 1, "shared")]
    assert len({key for key, _ in alt_schedule(5, "pass")}) == 5  # every pass its own batch order
    assert alt_schedule(0, "pass") == []
    with pytest.raises(ConfigError, match="alt_epoch"):
        alt_schedule(1, "epoch")
    with pytest.raises(ConfigError, match="^alt_epoch='epoch'"):
        FEDSELECT.make_config({"alt_epoch": "epoch"})


@pytest.mark.parametrize("unit, expected", [("pass", {"personal": 3, "shared": 2}),
                                            ("pair", {"personal": 5, "shared": 5})])
def test_local_alt_pass_counts(fed, unit, expected):
    env = digits_env()
    model = _model(env)
    personal = {n: torch.full(p.shape, n.startswith("head"), dtype=torch.bool) for n, p in model.named_parameters()}
    stats = local_alt(model, fed.clients[0], personal, _cfg(local_epochs=5, alt_epoch=unit), env)
    assert stats["passes"] == expected
    # a part without entries: under "pass" its passes go to the other part, under "pair" they are skipped
    nobody = {n: torch.zeros(p.shape, dtype=torch.bool) for n, p in model.named_parameters()}
    stats = local_alt(model, fed.clients[0], nobody, _cfg(local_epochs=5, alt_epoch=unit), env)
    assert stats["passes"] == {"personal": 0, "shared": 5}


def test_keep_largest_by_hand():
    scores = {"a": torch.tensor([5.0, 1.0, 3.0, 9.0]), "b": torch.tensor([[2.0, 8.0]])}
    cand = {"a": torch.tensor([True, True, True, False]), "b": torch.tensor([[True, True]])}
    out = keep_largest(scores, cand, 0.4)  # 5 candidates -> keep 2: 8 (b) and 5 (a); 9 is no candidate
    assert out["a"].tolist() == [True, False, False, False] and out["b"].tolist() == [[False, True]]
    out = keep_largest(scores, cand, 0.5, ranking="layer")  # a: 3 -> 2 (5, 3); b: 2 -> 1 (8)
    assert out["a"].tolist() == [True, False, True, False] and out["b"].tolist() == [[False, True]]


def _toy():
    env = Env(model_fn=lambda: build_model("mlp", num_classes=2, input_shape=(1, 1, 2), hidden=(2,)))
    model = env.scratch_model()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 100 * i)
    return env, model


def test_masked_average_and_global_or_by_hand():
    """Three clients, hand-made masks: each entry is averaged over the clients sharing it."""
    env, model = _toy()
    cfg = _cfg()
    state = FEDSELECT.init(model, None, cfg, env)
    g = state["weights"]
    name = "hidden.0.weight"  # shape (2, 2)
    personal = [torch.tensor([[True, False], [False, False]]), torch.tensor([[True, True], [False, False]]),
                torch.tensor([[True, False], [True, False]])]
    values = [torch.full((2, 2), 1.0), torch.full((2, 2), 2.0), torch.full((2, 2), 4.0)]
    sizes = [1, 1, 2]
    updates, clients = [], {}
    for cid, (pm, v, n) in enumerate(zip(personal, values, sizes)):
        w = {k: t.clone() for k, t in g.items()}
        w[name] = v
        travel = {k: torch.ones_like(t, dtype=torch.bool) for k, t in g.items()}
        travel[name] = ~pm
        clients[cid] = {"weights": w, "travel": travel}
        updates.append(Update(cid, n, to_sparse(w, travel, buffers=False)))
    new = aggregate(state, updates, cfg, env)
    got = new["weights"][name]
    # (0,0): personal everywhere -> old global; (0,1): clients 0, 2 -> (1*1 + 2*4) / 3;
    # (1,0): clients 0, 1 -> (1 + 2) / 2; (1,1): all -> (1 + 2 + 8) / 4
    want = torch.tensor([[g[name][0, 0], 3.0], [1.5, 11 / 4]])
    assert torch.allclose(got, want)
    other = "head.weight"  # fully shared by everyone: the plain sample-weighted mean
    assert torch.allclose(new["weights"][other], g[other])
    assert new["global_mask"][name].tolist() == [[True, True], [True, False]]
    assert not new["global_mask"][other].any()
    # write-back: an entry personal on every client keeps each client's own value
    for cid in clients:
        mine = personalized_state(new, clients[cid], cfg)[name]
        assert mine[0, 0] == values[cid][0, 0]
        assert torch.equal(mine[~personal[cid]], got[~personal[cid]])


def test_payload_counts_only_shared_entries_and_broadcast_round_trips():
    env, model = _toy()
    cfg = _cfg()
    state = FEDSELECT.init(model, None, cfg, env)
    w = get_state(model)
    personal = filled(model, False)
    personal["hidden.0.weight"] = torch.tensor([[True, False], [False, True]])
    personal["head.bias"] = torch.tensor([True, True])
    travel = {n: ~m for n, m in personal.items()}
    payload = to_sparse(w, travel, buffers=False)
    shared = sum(int(t.sum()) for t in travel.values())
    assert "head.bias" not in payload["values"] and set(payload["masks"]) == {"hidden.0.weight"}
    assert nbytes(payload) == 4 * shared + 1  # float32 values + one byte of bits for 4 entries
    state = aggregate(state, [Update(7, 3, payload)], cfg, env)
    msg = broadcast(state, 7, cfg, env)
    assert nbytes(msg) == 4 * shared  # the client knows its mask: only values come down
    assert "full" in broadcast(state, 8, cfg, env)  # never seen: the whole global model
    client = {"weights": {k: v + 1000 for k, v in w.items()}, "travel": travel}
    rebuilt = receive(msg, client)
    want = personalized_state(state, client, cfg)
    assert all(torch.equal(rebuilt[k], want[k]) for k in want)


@pytest.mark.parametrize("holes", [0, 1, 5, 300])
def test_mask_codes_round_trip_and_pick_the_cheaper(holes):
    m = torch.ones(40, 25, dtype=torch.bool)
    m.view(-1)[torch.randperm(1000, generator=torch.Generator().manual_seed(holes))[:holes]] = False
    code = encode_mask(m)
    assert torch.equal(decode_mask(code, m.shape), m)
    assert nbytes(code) == min(4 * holes, 125)  # int32 positions of the holes, or 1000 / 8 bytes of bits


def test_rounds_schedule_grows_the_personal_mask_by_p_of_the_rest_up_to_the_target(fed):
    """The authors' schedule: 1 - (1 - p)^r personal after r rounds, nested, capped at the target."""
    env = digits_env()
    cfg = _cfg(schedule="rounds", personalization_rate=0.5, target=0.8, scope="weights")
    model = _model(env)
    names = eligible_names(model, "weights")
    total = sum(p.numel() for n, p in model.named_parameters() if n in names)
    state, client_state, previous = FEDSELECT.init(model, fed, cfg, env), None, None
    for r, want in enumerate((0.5, 0.75, 0.8)):
        now = env.at_round(r)
        upd, client_state = FEDSELECT.client_update(FEDSELECT.broadcast(state, 0, cfg, now), fed.clients[0],
                                                    client_state, cfg, now)
        state = FEDSELECT.aggregate(state, [upd], cfg, now)
        personal = {n: ~t for n, t in client_state["travel"].items()}
        assert sum(int(personal[n].sum()) for n in names) / total == pytest.approx(want, abs=1e-3)
        assert not any(personal[n].any() for n in personal if n not in names)  # biases, BN stay shared
        if previous is not None:
            assert all(not (previous[n] & ~personal[n]).any() for n in names)  # never shrinks
        previous = personal


def test_end_to_end_deterministic_and_communication_shrinks(fed):
    def run():
        env = digits_env()
        return run_rounds(FEDSELECT, _cfg(personalization_rate=0.75, ltn_iterations=1), fed, _model(env), env)

    a, b = run(), run()
    assert a.status == "ok" and [c["correct"] for c in a.per_client.values()] == [
        c["correct"] for c in b.per_client.values()]
    full, later = a.history[0]["bytes_down"], a.history[1]["bytes_down"]
    share = a.history[1]["client_personal_share"]
    assert share == pytest.approx(0.75, abs=0.01)  # p^L with L = 1
    assert later < full * (1 - share + 0.1)
    for cs in a.client_states.values():
        assert set(cs) == {"weights", "travel"}


@pytest.mark.parametrize("key, value", [("personalization_rate", 0.0), ("personalization_rate", 1.5),
                                        ("ltn_iterations", 0), ("start", "theta_1"), ("scope", "biases"),
                                        ("ranking", "random"), ("bn_stats", "mixed"),
                                        ("schedule", "epochs"), ("target", 0.0)])
def test_bad_settings_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        FEDSELECT.make_config({key: value})


def test_registry_and_v2_default():
    assert ALGORITHMS["fedselect"] is FEDSELECT and ALGORITHMS["fedselect_v2"] is FEDSELECT_V2
    assert FEDSELECT_V2.make_config({}).start == "theta_L" and FEDSELECT.make_config({}).start == "theta_0"
    model = build_model("lenet", num_classes=10, input_shape=(3, 32, 32), bn=True)
    assert eligible_names(model, "weights") == ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight",
                                                "head.weight"]


def test_resumed_run_matches_an_uninterrupted_one(fed, tmp_path):
    """Masks, personal values and per-client server masks all live in checkpointable state."""
    def run(rounds, **kw):
        env = digits_env()
        return run_rounds(FEDSELECT_V2, _cfg(FEDSELECT_V2, ltn_iterations=1, rounds=rounds), fed, _model(env), env,
                          **kw)

    ck = tmp_path / "fs.ckpt"
    run(1, checkpoint=ck, test=False)
    resumed, straight = run(2, checkpoint=ck, resume=True), run(2)
    for k, v in straight.state["weights"].items():
        assert torch.equal(resumed.state["weights"][k], v)
    assert [c["correct"] for c in resumed.per_client.values()] == [c["correct"] for c in straight.per_client.values()]


def test_mask_report_mean_pairwise_iou_by_hand():
    # personal = ~travel; client 0 keeps {0, 1} personal, client 1 {1, 2}, client 2 {1, 2}
    def state(personal):
        m = torch.zeros(4, dtype=torch.bool)
        m[list(personal)] = True
        return {"travel": {"w": ~m[:3], "b": ~m[3:]}}

    class Fed:
        num_clients = 4

    rep = mask_report({}, Fed, None, None, {0: state({0, 1}), 1: state({1, 2}), 2: state({1, 2})})
    # IoU(0,1) = |{1}| / |{0,1,2}| = 1/3, IoU(0,2) = 1/3, IoU(1,2) = 1
    assert rep["mask_iou"] == pytest.approx((1 / 3 + 1 / 3 + 1) / 3)
    assert rep["personal_share"] == [0.5, 0.5, 0.5, None]
    assert mask_report({}, Fed, None, None, {0: state({0})})["mask_iou"] is None
