"""pFedVEM / pFedMAP (Zhu, Ma, Blaschko, FL-NeurIPS'22) in the report: its title, the datasets that stand in for
its own, and its claim (`claims`). Its tables and figures: `figures`."""
from pflkit.report.pfedvem.claims import pfedvem_best_under_drift

TITLE = "pFedVEM / pFedMAP: PFL with Label Concept Drift (Zhu, Ma, Blaschko, FL-NeurIPS'22)"
# dataset used -> the paper's datasets whose published numbers its rows are compared with
STAND_INS = {"cifar10": "CIFAR-100 / SUN397", "omniglot": "CIFAR-100 / SUN397"}
KEEP_STATES: tuple[str, ...] = ()  # no notebook of pFedVEM reads a run's trained states
CLAIMS = (pfedvem_best_under_drift,)
