"""``opefo-probe``: one rollout step's entropy-flow statistics without training (docs/training.md,
"Which regime is my run in?"). ``step`` runs the trainer's own step-1 path up to the optimizer,
``group_flows`` splits the flows by prompt group and success rate, ``output`` writes the table,
the verdict and the JSON document; ``cli/probe.py`` is the command.
"""
