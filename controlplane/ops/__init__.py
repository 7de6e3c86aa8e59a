"""The operator's view of a running control plane: Prometheus metrics (`metrics.py`), provider
health as the reconciler saw it (`health.py`), optional OpenTelemetry traces (`traces.py`) and the
log records on stderr, as text or JSON with a task's fields (`logs.py`).
The dashboard that shows them is `controlplane.dashboard`."""
