"""pFedHN's opt-in report: the arrays Fig. 3 and Fig. 4 draw, kept in the run and its compact result."""
import json

import pytest

from pflkit.algorithms.pfedhn import PFedHNConfig, PFedHNPCConfig
from pflkit.config import ConfigError
from pflkit.run.experiments import resolve
from pflkit.report.compact import analysis
from pflkit.run.runner import run_experiment

pytestmark = pytest.mark.needs_data(experiments=["pfedhn_fig3_mixmatch"])


def test_mix_and_match_needs_personal_heads_and_says_so_before_training():
    with pytest.raises(ConfigError, match="report_mix_and_match=True"):
        PFedHNConfig(report_mix_and_match=True)
    PFedHNPCConfig(report_mix_and_match=True)  # pFedHN-PC has them


def test_no_flag_no_report_file(tmp_path):
    """A stage that asks for nothing leaves exactly what it left before (the behaviour digest reads it)."""
    cfg = resolve("pfedhn_fig3_mixmatch", "smoke", ['methods."pFedHN-PC".report_mix_and_match=false'])
    run_experiment(cfg, tmp_path, progress=False, engine="sequential")
    assert not (tmp_path / "seed0" / "pfedhn-pc.report.json").exists()


def test_mix_and_match_diagonal_is_each_clients_own_accuracy(tmp_path):
    cfg = resolve("pfedhn_fig3_mixmatch", "smoke",
                  ['methods."pFedHN-PC".report_mix_and_match=true', 'methods."pFedHN-PC".report_embeddings=true'])
    res = run_experiment(cfg, tmp_path, progress=False, engine="sequential")
    seed = analysis(tmp_path, res)["pFedHN-PC"]["seeds"][0]
    acc, emb = seed["mix_and_match"], seed["embedding"]
    n = cfg.data.num_clients
    assert len(acc) == n and all(len(row) == n for row in acc) and len(emb) == n
    assert all(len(c) == 2 for c in seed["classes"])  # the row's partition: two classes per client
    own = res["methods"]["pFedHN-PC"]["per_client"][0]
    assert [acc[i][i] for i in range(n)] == pytest.approx(own, abs=1e-3)  # row i, column i: its own extractor
    assert any(acc[i][j] != acc[i][i] for i in range(n) for j in range(n) if i != j)  # others differ somewhere
    assert len(json.dumps(seed)) < 100_000
