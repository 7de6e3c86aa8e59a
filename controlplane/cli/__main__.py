"""`python -m controlplane.cli`: the same app as the `controlplane` command."""

from controlplane.cli import app

app()
