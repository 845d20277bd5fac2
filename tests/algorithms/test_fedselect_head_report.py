"""FedSelect's opt-in Fig. 1 report: the head masks' pairwise IoU, equal to the analysis of the kept states."""
import numpy as np
import pytest

from pflkit.analysis.masks import client_masks, density, pairwise_iou
from pflkit.data.datasets import load_dataset
from pflkit.run.experiments import resolve
from pflkit.fl.federation import Federation
from pflkit.io import read_json
from pflkit.models import head_param_names
from pflkit.run.environment import make_env
from pflkit.run.folder import load_final_states
from pflkit.run.runner import run_experiment

LABEL = 'methods."FedSelect (0.50)"'

pytestmark = pytest.mark.needs_data(experiments=["fedselect_table1_s2"])


def _run(tmp_path, flag: bool):
    cfg = resolve("fedselect_table1_s2", "smoke", [f"{LABEL}.report_head_iou={str(flag).lower()}"])
    run_experiment(cfg, tmp_path, progress=False, engine="sequential", keep_states=True)
    return cfg, read_json(tmp_path / "seed0" / "fedselect-0-50.report.json")


def test_off_the_report_is_as_before(tmp_path):
    _, rep = _run(tmp_path, False)
    assert set(rep) == {"personal_share", "mask_iou"}


def test_head_iou_equals_the_kept_states_analysis(tmp_path):
    cfg, rep = _run(tmp_path, True)
    iou = np.asarray(rep["head_mask_iou"])
    assert np.allclose(np.diag(iou), 1.0) and np.allclose(iou, iou.T)
    states = load_final_states(tmp_path, "FedSelect (0.50)", 0)["client_states"]
    masks = client_masks(states)
    fed = Federation.load(tmp_path / "seed0" / "federation.npz", load_dataset(cfg.data.dataset, **cfg.data.options))
    head = head_param_names(make_env(cfg, fed, 0).model_fn())
    expected = pairwise_iou([masks[c] for c in sorted(masks)], names=head)
    assert np.allclose(iou, expected, atol=1e-4)
    assert np.allclose(rep["head_personal_share"], [density(masks[c], head) for c in sorted(masks)], atol=1e-4)
