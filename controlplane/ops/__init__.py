"""The operator's view of a running control plane: Prometheus metrics (`metrics.py`), provider
health as the reconciler saw it (`health.py`) and optional OpenTelemetry traces (`traces.py`).
The dashboard that shows them is `controlplane.dashboard`."""
