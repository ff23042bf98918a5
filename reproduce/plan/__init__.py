"""Planning a sweep: worker processes, SLURM, status and the cost model behind --dry-run."""
