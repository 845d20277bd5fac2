"""Meta-learning math of FedL2P, free of any federation: meta-nets, client statistics of a model
on given batches, functional fine-tuning, the outer losses and the step on lambda, linear solvers and
hypergradients. The algorithm is `pflkit.algorithms.fedl2p`, one client's side of it
`pflkit.algorithms.fedl2p_client`."""
from pflkit.meta.client_stats import ClientStats, bn_divergence, client_stats, layer_input_stats, symmetric_kl
from pflkit.meta.functional import finetune, lookahead_loss, sgd_step, validation_loss
from pflkit.meta.hypergrad import clip_by_value, fo_maml_metagrad, fomaml_plus, hf_maml_metagrad, ift_hypergrad
from pflkit.meta.linear_solve import cg, neumann
from pflkit.meta.metanets import MetaNet, MetaSpec, bnnet, clamp_ste, init_meta_params, lrnet, meta_hyperparams
from pflkit.meta.objectives import LT_MODES, lambda_step, meta_losses

__all__ = [
    "ClientStats", "bn_divergence", "client_stats", "layer_input_stats", "symmetric_kl",
    "finetune", "lookahead_loss", "sgd_step", "validation_loss",
    "clip_by_value", "fo_maml_metagrad", "fomaml_plus", "hf_maml_metagrad", "ift_hypergrad",
    "cg", "neumann",
    "MetaNet", "MetaSpec", "bnnet", "clamp_ste", "init_meta_params", "lrnet", "meta_hyperparams",
    "LT_MODES", "lambda_step", "meta_losses",
]
