"""The command line's commands: each a class that owns its arguments and its body
(``lm-evaluation-harness``'s ``_cli`` shape). Their modules import nothing heavy at the top:
what trains or loads a model (torch, Lightning) is imported in ``run``, so ``--help`` and a bad
option answer at once, and the commands that only read records start without Lightning."""
