"""FedSelect's protocol: every method of Table 1 makes the local passes the paper fixes.

FedSelect sec. 3: "we fix the number of local epochs across all methods to 5". An epoch is one
pass over the client's train split, so with n samples and batch size b a pass is ceil(n / b)
optimizer steps. These tests take every method of ``fedselect_table1_s2`` at the ``paper``
preset, run one client update on a small federation, record every SGD step (which parameters it
held) and compare with the definition:

* FedAvg, LG-FedAvg, FedPer, LotteryFL: 5 passes over all parameters;
* FedBABU: 5 passes over the body (the head never trains);
* Ditto: 5 passes for the personal model and 5 for the global one (two models, 5 epochs each);
* FedRep: 4 head passes, then 1 body pass (FedRep's ``local_rep_ep`` = 1 within the 5);
* FedAlt: head, body, head, body, head (LocalAlt: 5 passes alternating, personal first);
* FedSelect: L GradLTN phases of E epochs (L + 1 for FedSelectv2), then 5 LocalAlt passes.

The earlier readings, kept as options (FedRep ``epoch_budget="separate"``, LocalAlt
``alt_epoch="pair"``), give other counts, also checked here.
"""
import math
from contextlib import contextmanager

import pytest

from pflkit.algorithms import get_algorithm
from pflkit.run.experiments import resolve
from pflkit.fl import train
from pflkit.fl.federate import build_federation
from pflkit.models.introspect import head_param_names
from tests.helpers_data import digits_dataset, digits_env

N_PER_CLASS = 12  # 2 classes per client: n = 24 train samples, so batch 10 makes passes of 10 + 10 + 4


@pytest.fixture(scope="module")
def fed():
    fed = build_federation(digits_dataset(), "shards", 3, seed=0, split="paired", val_fraction=0.0,
                           classes_per_client=2, samples_per_class=(N_PER_CLASS, 5))
    assert fed.clients[0].num("train") == 2 * N_PER_CLASS
    return fed


@pytest.fixture(scope="module")
def table1():
    return {m.label: m for m in resolve("fedselect_table1_s2", preset="paper").methods}


@contextmanager
def recorded_steps(model):
    """Every SGD step of a local training while inside (`pflkit.fl.train.sgd_step`, the step the
    local loop takes): the names of the parameters it held."""
    names = {id(p): n for n, p in model.named_parameters()}
    log = []
    real = train.sgd_step

    def step(params, *args, **kwargs):
        log.append(frozenset(names.get(id(p), "?") for p in params))
        return real(params, *args, **kwargs)

    train.sgd_step = step
    try:
        yield log
    finally:
        train.sgd_step = real


def runs(log) -> list[tuple[frozenset, int]]:
    """Consecutive steps on the same parameters, merged: [(parameters, steps), ...]."""
    out = []
    for names in log:
        if out and out[-1][0] == names:
            out[-1] = (names, out[-1][1] + 1)
        else:
            out.append((names, 1))
    return out


def one_update(algo_name, cfg, fed):
    """One client update of client 0 from a fresh state; returns the steps and the model's parts."""
    algo = get_algorithm(algo_name)
    env = digits_env()
    env.seed_torch("init")
    model = env.scratch_model()
    everything = frozenset(n for n, _ in model.named_parameters())
    head = frozenset(head_param_names(model))
    state = algo.init(env.model_fn(), fed, cfg, env)
    msg = algo.broadcast(state, 0, cfg, env)
    with recorded_steps(model) as log:
        algo.client_update(msg, fed.clients[0], None, cfg, env)
    return log, everything, head


def expected_runs(algo_name, cfg, everything, head):
    """The paper's passes, as runs of (parameters, steps); None where only the total is pinned.

    Written from the definitions above, not from the settings that select them, so a wrong
    default (``epoch_budget``, ``alt_epoch``) fails here.
    """
    passes = math.ceil(2 * N_PER_CLASS / cfg.batch_size)
    body = everything - head
    e = cfg.local_epochs
    if algo_name in ("fedavg", "lgfedavg", "fedper", "lotteryfl"):
        return [(everything, e * passes)]
    if algo_name == "fedbabu":
        return [(body, e * passes)]
    if algo_name == "ditto":  # the personal model, then the global one, on the same parameter names
        return [(everything, 2 * e * passes)]
    if algo_name == "fedrep":  # FedRep's 1 body epoch, the rest of the 5 on the head
        return [(head, (e - 1) * passes), (body, passes)]
    if algo_name == "fedalt":  # e passes, personal (the head) first, alternating
        return [((head, body)[j % 2], passes) for j in range(e)]
    return None


def expected_total(cfg):
    """FedSelect: GradLTN's phases of E epochs, then local_epochs LocalAlt passes."""
    passes = math.ceil(2 * N_PER_CLASS / cfg.batch_size)
    if cfg.schedule == "rounds":  # the authors' schedule, GradLTN not run
        return cfg.local_epochs * passes
    phases = cfg.ltn_iterations + (cfg.start == "theta_L")  # theta_0: the last phase would be discarded
    return (phases * cfg.ltn_epochs + cfg.local_epochs) * passes


LABELS = ["FedAvg", "LG-FedAvg", "LotteryFL", "Ditto", "FedBABU", "FedPer", "FedRep", "FedAlt",
          "FedSelect (0.50)", "FedSelectv2 (e=1)", "FedSelect/code (0.25)"]


@pytest.mark.parametrize("label", LABELS)
def test_every_table1_method_makes_the_papers_passes(label, table1, fed):
    if label == "FedAvg":
        stage = resolve("fedselect_table1_s2", preset="paper").pretrain
    else:
        stage = table1[label]
    cfg = stage.config
    assert cfg.local_epochs == 5  # sec. 3: 5 local epochs for every method
    log, everything, head = one_update(stage.algorithm, cfg, fed)
    want = expected_runs(stage.algorithm, cfg, everything, head)
    if want is None:
        assert len(log) == expected_total(cfg)
    else:
        assert runs(log) == want


@pytest.mark.parametrize("name", ["fedselect_table1_s2", "fedselect_table1_s4"])
def test_table1_settings_of_fedrep_and_localalt(name):
    """FedRep: 4 head + 1 body epochs; LocalAlt: 5 passes; FedSelect's GradLTN: 5 x 5 epochs.

    Baselines' other settings from their authors' code (sec. 3): FedRep SGD lr 0.01, momentum 0.5,
    weight decay 1e-4, batch 10; LG-FedAvg (CIFAR-10 script) lr 0.1, momentum 0.5, batch 50.
    """
    table = {m.label: m.config for m in resolve(name, preset="paper").methods}
    assert table["FedRep"].phases() == (4, 1)
    for label in ("FedAlt", "FedSelect (0.25)", "FedSelect (0.50)", "FedSelect (0.75)", "FedSelectv2 (e=5)"):
        assert table[label].alt_epoch == "pass" and table[label].local_epochs == 5
    cfg = table["FedSelect (0.50)"]
    assert (cfg.ltn_iterations, cfg.ltn_epochs, cfg.local_epochs) == (5, 5, 5)
    rep, lg = table["FedRep"], table["LG-FedAvg"]
    assert (rep.lr, rep.momentum, rep.weight_decay, rep.batch_size) == (0.01, 0.5, 1e-4, 10)
    assert (lg.lr, lg.momentum, lg.batch_size) == (0.1, 0.5, 50)


@pytest.mark.parametrize("name", ["fedselect_table1_s2", "fedselect_table1_s4", "fedselect_claim_s2"])
@pytest.mark.parametrize("preset", ["paper", "cpu", "smoke"])
def test_table1_baselines_use_their_authors_settings(name, preset):
    """Sec. 3: every baseline's other hyperparameters are its authors' recommended ones, at every preset.

    FedAvg (the stage LG-FedAvg starts from, LG-FedAvg's CIFAR-10 script): lr 0.1, momentum 0.5, batch 50;
    FedPer (its paper's CIFAR setting): lr 0.01, no momentum, batch 128; FedBABU (its authors' CIFAR
    scripts): lr 0.1, momentum 0.5, batch 50; Ditto (its authors' clean-data scripts): plain SGD lr 0.05,
    batch 16, lambda 1; LotteryFL (its authors' command for 2-class CIFAR-10 clients of 20 samples per
    class): lr 0.01, momentum 0.5, batch 32, 20% pruning steps to 50% above accuracy 0.1.
    """
    exp = resolve(name, preset=preset)
    table = {m.label: m.config for m in exp.methods}
    want = {
        "FedPer": dict(lr=0.01, momentum=0.0, batch_size=128),
        "FedBABU": dict(lr=0.1, momentum=0.5, batch_size=50),
        "Ditto": dict(lr=0.05, momentum=0.0, batch_size=16, lam=1.0),
        "LotteryFL": dict(lr=0.01, momentum=0.5, batch_size=32, prune_step=0.2, prune_target=0.5,
                          acc_threshold=0.1),
    }
    checked = 0
    for label, values in want.items():
        if label in table:
            checked += 1
            assert {k: getattr(table[label], k) for k in values} == values, label
    assert checked == (2 if name == "fedselect_claim_s2" else 4)
    fedavg = exp.pretrain.config
    assert (fedavg.lr, fedavg.momentum, fedavg.batch_size) == (0.1, 0.5, 50)


@pytest.mark.parametrize("algo_name, options, head_steps, body_steps", [
    ("fedrep", {}, 4, 1),
    ("fedrep", {"epoch_budget": "separate"}, 10, 5),  # the earlier reading: 10 head + 5 body epochs
    ("fedrep", {"local_epochs": 11}, 10, 1),           # FedRep's own setting
    ("fedalt", {}, 3, 2),
    ("fedalt", {"alt_epoch": "pair"}, 5, 5),            # the authors' LocalAlt: 10 passes for 5 epochs
])
def test_options_count_by_definition(algo_name, options, head_steps, body_steps, fed):
    cfg = get_algorithm(algo_name).make_config({"lr": 0.05, "batch_size": 10, **options})
    log, everything, head = one_update(algo_name, cfg, fed)
    passes = math.ceil(2 * N_PER_CLASS / 10)
    assert sum(k for names, k in runs(log) if names == head) == head_steps * passes
    assert sum(k for names, k in runs(log) if names == everything - head) == body_steps * passes
    assert len(log) == (head_steps + body_steps) * passes
