"""FedL2P (Lee et al., NeurIPS 2023) in the report: its title, the datasets that stand in for its own, and its
claims in the order the report lists them (`claims`). Its figures and tables: from run folders (`figures`),
from the committed compact results (`learned`)."""
from pflkit.report.fedl2p.claims import (fedl2p_beta_by_shift, fedl2p_beta_per_client, fedl2p_ift_matches_fomaml,
                                         fedl2p_lrnet_input_ari, fedl2p_matches_best_ft)

TITLE = "FedL2P: Federated Learning to Personalize (Lee et al., NeurIPS 2023)"
# dataset used -> the paper's dataset whose published numbers its rows are compared with (an experiment file
# may say it itself: [experiment] stands_in_for = "...")
STAND_INS = {"digit_domains": "Office-Caltech-10 / DomainNet", "fsdd": "Speech Commands"}
KEEP_STATES: tuple[str, ...] = ()  # no notebook of FedL2P reads a run's trained states
CLAIMS = (fedl2p_beta_by_shift, fedl2p_beta_per_client, fedl2p_matches_best_ft, fedl2p_lrnet_input_ari,
          fedl2p_ift_matches_fomaml)
