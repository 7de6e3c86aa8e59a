"""What a provider raises when its runner's API refuses or fails, by what the control plane does next.

`TransientProviderError`: retry later (throttling, 5xx, network), never a reason to fail a task.
`CapacityProviderError`: the runner has no room now (quota, a full region); the request is sound
and may succeed later or on another placement. `PermanentProviderError`: the request is wrong
and stays wrong. Any other exception is treated as transient.
"""

from __future__ import annotations


class ProviderError(Exception):
    pass


class TransientProviderError(ProviderError):
    """Throttling, 5xx, network: retry later, never fail a task for this alone."""


class PermanentProviderError(ProviderError):
    """The request is wrong and will stay wrong (e.g. an unknown job queue)."""


class CapacityProviderError(ProviderError):
    """The runner has no room for the job now (a full region or zone, a vCPU, job or concurrency
    quota): the request is sound and may succeed later or on another placement."""


class MalformedHandle(ProviderError, ValueError):
    """A stored handle that is not one of this provider's (a missing or mistyped field)."""
