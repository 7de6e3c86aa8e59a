"""The reconciler's parts apart from its cycle (`controlplane.reconciler`): what a cycle shares
(`cycle.py`: its figures, the provider call with its tries) and the extra executions of an
attempt, stopped or followed (`extras.py`)."""
