"""Training runs: the Hydra config schemas, stage plans, run directories, the run itself, its metrics,
cache and sweep summaries."""
