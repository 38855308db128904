"""General continual learning: CoCa and its baselines, reproduced as a DVC pipeline."""
