"""Cloud Run's pieces beside its provider (`controlplane_providers.cloud_run`): settings and options,
an execution's status, one Admin API call, the Cloud Logging tail."""
