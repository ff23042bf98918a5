"""Launching: a table's runs trained here (``local``, ``workers``) or as SLURM array tasks
(``submission`` and ``slurm`` on the login node, ``task`` and ``render_job`` on a compute node),
what the queue holds
of them (``queue``) and where every run stands (``progress``, for ``status``). A command calls
``dispatch.launch_table``."""
