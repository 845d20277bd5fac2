"""FedSelect (Tamirisa et al.) in the report: its title, the runs whose trained states its notebook reads, and its
claim (`claims`). Its tables and figures: `figures`."""
from pflkit.report.fedselect.claims import fedselect_beats_fedavg_lg

TITLE = "FedSelect: Customized Selection of Parameters for Fine-Tuning in PFL (Tamirisa et al.)"
STAND_INS: dict[str, str] = {}  # its rows run on the paper's own datasets
# runs (experiment-name globs) whose stages keep their final states for a notebook to read instead of training
# again: the client masks of Fig. 1
KEEP_STATES = ("fedselect_table1_*",)
CLAIMS = (fedselect_beats_fedavg_lg,)
