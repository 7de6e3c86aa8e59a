"""AWS Batch's pieces beside its provider (`controlplane_providers.aws_batch`): its errors, and
the scratch disk a job definition guarantees."""
