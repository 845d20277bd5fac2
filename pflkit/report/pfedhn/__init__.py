"""pFedHN (Shamsian et al., ICML 2021) in the report: its title, the runs whose trained states its notebooks
read, and its claims in the order the report lists them (`claims`). Its tables: `tables`; its figures:
`figures`."""
from pflkit.report.pfedhn.claims import pfedhn_beats_baselines_n50, pfedhn_pc_matches

TITLE = "pFedHN: Personalized Federated Learning using Hypernetworks (Shamsian et al., ICML 2021)"
STAND_INS: dict[str, str] = {}  # its rows run on the paper's own datasets
# runs (experiment-name globs) whose stages keep their final states for a notebook to read instead of training
# again: pFedHN-PC's mix-and-match (Fig. 3) and pFedHN's client embeddings (Fig. 4)
KEEP_STATES = ("pfedhn_fig3_mixmatch", "pfedhn_fig4_embeddings")
CLAIMS = (pfedhn_pc_matches, pfedhn_beats_baselines_n50)
