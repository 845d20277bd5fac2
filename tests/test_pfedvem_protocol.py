"""One participation protocol for every method of pFedVEM's tables (sec. 3.1, after pFedMe).

Under ``participation="broadcast"`` every client gets the broadcast and runs its local update; the
clients that report are the loop's Bernoulli draw with p = report_fraction. Under ``"sampled"``
the loop's Bernoulli draw picks who trains (and reports). Checked round by round on a tiny
federation for FedAvg, FedPer, pFedMe, pFedVEM and pFedMAP, and on the experiment files.
"""
import pytest
import torch

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms.fedavg import FedAvgConfig
from pflkit.algorithms.fedper import FedPerConfig
from pflkit.algorithms.pfedme import PFedMeConfig
from pflkit.algorithms.pfedvem import PFedMAPConfig, PFedVEMConfig
from pflkit.config import ConfigError
from pflkit.run.experiments import list_experiments, resolve
from pflkit.fl.federate import build_federation
from pflkit.fl.sampling import SamplingRule, sample_clients
from tests.helpers_data import digits_dataset, digits_env

R = 0.4  # reporting probability of the tiny federation (0.1 of 6 clients would mostly redraw to one)
ROUNDS = 3
SETTINGS = {  # case: (algorithm, tiny sizes)
    "fedavg": ("fedavg", {"local_epochs": 1}),
    "fedper": ("fedper", {"local_epochs": 1}),
    "pfedme": ("pfedme", {"local_steps": 2, "inner_steps": 1, "eval_mode": "last"}),  # keeps theta_i
    "pfedme_fresh": ("pfedme", {"local_steps": 2, "inner_steps": 1}),  # theta_i recomputed at test time
    "pfedvem": ("pfedvem", {"local_epochs": 1, "head_steps": 2, "init_scale": 0.05}),
    "pfedmap": ("pfedmap", {"local_epochs": 1, "head_steps": 2}),
}
STATEFUL = {"fedper", "pfedme", "pfedvem", "pfedmap"}  # clients keep something across rounds


@pytest.fixture(scope="module")
def fed():
    return build_federation(digits_dataset(600), "concept_drift", 6, seed=0, task="superclass", val_fraction=0.0)


def _config(name, protocol):
    algo, sizes = SETTINGS[name]
    base = {"batch_size": 64, "keep_best": False, "eval_every": 0, **sizes}
    if protocol == "broadcast":
        base.update(participation="broadcast", fraction=1.0, sampling="fraction", report_fraction=R)
    else:
        base.update(participation="sampled", sampling="bernoulli", fraction=R)
    return ALGORITHMS[algo].make_config(base)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _rounds(name, protocol, fed):
    """The loop's round, step by step: per round (receivers, reporters, clients whose state changed, state)."""
    algo, cfg = ALGORITHMS[SETTINGS[name][0]], _config(name, protocol)
    env = digits_env(num_classes=fed.num_classes)
    env.seed_torch("init")
    state, client_states, out = algo.start(env.model_fn(), fed, cfg, env), {}, []
    for t in range(ROUNDS):
        now = env.at_round(t)
        ids = sample_clients(fed.seen_ids, SamplingRule.of(cfg), env, t)
        updates, changed = [], set()
        for cid in ids:
            before = client_states.get(cid)
            now.seed_torch("client", cid, t)
            upd, client_states[cid] = algo.respond(algo.send(state, cid, cfg, now), fed.clients[cid], before, cfg,
                                                   now)
            updates.append(upd)
            if client_states[cid] is not None and not _same(before, client_states[cid]):
                changed.add(cid)
        state = algo.aggregate(state, updates, cfg, now)
        out.append((set(ids), {u.client_id for u in updates if u.payload is not None}, changed, state))
    return out, env


def _draw(fed, env, t):
    return set(sample_clients(fed.seen_ids, SamplingRule("bernoulli", R), env, t))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_same_rule_for_every_method(name, fed):
    bcast, env = _rounds(name, "broadcast", fed)
    sampled, _ = _rounds(name, "sampled", fed)
    everyone = set(fed.seen_ids)
    for t, ((got, sent, changed, _), (got_s, sent_s, changed_s, _)) in enumerate(zip(bcast, sampled)):
        draw = _draw(fed, env, t)
        assert 0 < len(draw) < len(everyone), "pick a seed whose draws are proper subsets"
        # broadcast: every client receives and trains, exactly the Bernoulli draw reports
        assert got == everyone and sent == draw
        assert changed == (everyone if name in STATEFUL else set())
        # sampled: the same draw receives, trains and reports; nobody else changes
        assert got_s == sent_s == draw
        assert changed_s == (draw if name in STATEFUL else set())
    # round 1: the reporters start from the same state under both protocols, so the server ends equal
    assert _same(bcast[0][3].get("weights", bcast[0][3].get("base")),
                 sampled[0][3].get("weights", sampled[0][3].get("base")))


def test_fedavg_is_the_same_under_both_protocols(fed):
    """FedAvg keeps nothing on clients: non-reporters' work is discarded, so both protocols agree in every round."""
    bcast, _ = _rounds("fedavg", "broadcast", fed)
    sampled, _ = _rounds("fedavg", "sampled", fed)
    assert all(_same(a[3]["weights"], b[3]["weights"]) for a, b in zip(bcast, sampled))


def test_defaults_other_papers_keep_and_pfedvem_broadcast():
    for cls in (FedAvgConfig, FedPerConfig, PFedMeConfig):
        assert cls().participation == "sampled"
    for cls in (PFedVEMConfig, PFedMAPConfig):
        c = cls()
        assert (c.participation, c.fraction, c.report_fraction) == ("broadcast", 1.0, 0.1)
    assert PFedVEMConfig(report_fraction=0.0, sampling="bernoulli").participation == "sampled"  # earlier spelling


@pytest.mark.parametrize("cls", [FedAvgConfig, FedPerConfig, PFedMeConfig, PFedVEMConfig])
def test_bad_protocol_values_name_the_key(cls):
    with pytest.raises(ConfigError, match="participation"):
        cls(participation="everyone")
    with pytest.raises(ConfigError, match="fraction"):  # broadcast must reach every client
        cls(participation="broadcast", fraction=0.1)
    with pytest.raises(ConfigError, match="report_fraction"):
        cls(participation="broadcast", fraction=1.0, report_fraction=1.5)


PFEDVEM_FILES = sorted(n for n, p in list_experiments().items() if p.parent.name == "pfedvem")


@pytest.mark.parametrize("name", PFEDVEM_FILES)
@pytest.mark.parametrize("preset", ["smoke", "cpu", "paper"])
def test_every_pfedvem_table_runs_one_protocol(name, preset):
    """Every method of the file runs under the paper's protocol; Local (no server: every client trains every
    round) and pFedHN (sampled clients visited in series, the paper's footnote 1) are the declared exceptions."""
    cfg = resolve(name, preset)
    assert cfg.data.val_fraction == 0.0  # no validation holdout: the clients keep all their training data
    for m in cfg.methods:
        c = m.config
        assert not c.keep_best  # the paper reports the last round (no validation set to select on)
        if m.algorithm == "local":
            assert c.fraction == 1.0
        elif m.algorithm == "pfedhn":
            continue
        else:
            assert (c.participation, c.fraction, c.sampling, c.report_fraction) == ("broadcast", 1.0, "fraction", 0.1), \
                m.label
