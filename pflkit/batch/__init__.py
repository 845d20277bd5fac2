"""The batch over the catalog (`reproduce`, its entry point): which experiments and which are up to date
(`selection`, `versions`), one experiment in its work folder (`work_folder`), the worker pool (`pool`), the
notebooks and the matrix figure after the runs (`notebook_runs`, `matrix_figure`), what the batch did
(`outcomes`); compact results in ``results/<preset>/``, stages taken from another run of the batch (`reuse`) or
rerun alone (`restage`), the behavioural fingerprints that say which committed result is out of date
(`behaviour`), and the hypergradient check (`neumann_check`). Nothing a run executes imports this package."""
