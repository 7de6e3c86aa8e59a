"""Azure Container Apps Jobs' pieces beside its provider (`controlplane_providers.container_apps`):
settings, options and shapes, ARM calls and errors, an execution's status, the Log Analytics tail."""
