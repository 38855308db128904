"""The report stage's library, a module per purpose:

- settings: the `report:` block of params.yaml (declared; gcl.config validates it)
- summary: the report's inputs (the resolved report typed, the runs' results) and the summary frame
- paper: the published numbers (reference/*.csv)
- display: labels, row order, and how every number prints (±, ≈, signed differences, counts)
- tables: the paper's tables beside ours, and the headline
- costs: each run's cost and its method's own metrics
- comparison: a method against the best of others per buffer, with Welch intervals
- claims: the paper's claims about its parts put as numbers and decided on intervals (Figure 4's
  sweeps, Table 3's ablation)
- document: tables.md and costs.md
- plot_data: what the figures draw and `dvc plots` reads
- figures: the PNG figures, drawn from plot_data
- write: results/, all outputs or none
- reproductions: committed reproductions, verified against their own dvc.lock
- cache: what a report keeps for the next (t-SNE embeddings, figures), under keys of all they are made from
- common: the report's error type, its warnings, the order of buffers

Nothing is imported here, so that gcl.config can read the report's settings without loading pandas and
matplotlib."""
