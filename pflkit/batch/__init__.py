"""The batch over the catalog (`reproduce`): compact results in ``results/<preset>/``, stages taken from
another run of the batch (`reuse`) or rerun alone (`restage`), the behavioural fingerprints that say which
committed result is out of date (`behaviour`), and the hypergradient check (`neumann_check`). Nothing a run
executes imports this package."""
