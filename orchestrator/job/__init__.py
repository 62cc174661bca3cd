"""The runs: one book (run: generate/agenerate; connect: the backends, their models and clients; writing: every
section over the fleet; finish: book.md, stats and the typeset book), outline first (stepwise: plan, write,
forecast), the job's forecast.json and budgets (forecast_file) and stats.json (report)."""
