"""One Cloud Run Admin API call: through the shared limiter, retried with jitter, its error classified.

Google answers both kinds of quota with 429 RESOURCE_EXHAUSTED and tells them apart in the
error's ErrorInfo (google/api/error_reason.proto): `RATE_LIMIT_EXCEEDED` is a rate quota
(requests a minute), retried here and then a TransientProviderError; `RESOURCE_QUOTA_EXCEEDED`
is an allocation quota (running executions, CPU or memory of a region), which waiting a few
seconds does not free: a CapacityProviderError at once, never retried in place. A 429 without
that reason is throttling, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests
from google.api_core import exceptions as gexc
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from controlplane_providers import ratelimit
from controlplane_providers.errors import CapacityProviderError, PermanentProviderError, TransientProviderError

TRANSIENT = (gexc.TooManyRequests, gexc.ServiceUnavailable, gexc.InternalServerError, gexc.BadGateway,
             gexc.GatewayTimeout, gexc.DeadlineExceeded, requests.exceptions.ConnectionError,
             requests.exceptions.Timeout)
CAPACITY_REASONS = {"RESOURCE_QUOTA_EXCEEDED"}  # ErrorInfo reasons of an allocation quota


def out_of_capacity(e: BaseException) -> bool:
    """A refusal for an allocation quota (see the module's doc), not for the rate."""
    return isinstance(e, gexc.TooManyRequests) and getattr(e, "reason", None) in CAPACITY_REASONS


def call(limiter: ratelimit.SlidingWindowLimiter, fn: Callable[..., Any], *, deadline_s: float,
         retry_on: tuple[type[BaseException], ...] = TRANSIENT, **kwargs: Any) -> Any:
    """`fn(**kwargs)` with the SDK's own retries off (`retry=None`), so that every try passes
    `limiter`; what `retry_on` names is retried here until `deadline_s` (an allocation quota
    never is). Raises CapacityProviderError, TransientProviderError or PermanentProviderError."""

    def once() -> Any:
        with ratelimit.held(limiter):
            return fn(**kwargs, retry=None, timeout=30)

    def retried(e: BaseException) -> bool:
        return isinstance(e, retry_on) and not out_of_capacity(e)

    try:
        for attempt in Retrying(retry=retry_if_exception(retried), wait=wait_random_exponential(multiplier=0.25, max=8),
                                stop=stop_after_delay(deadline_s) | stop_after_attempt(10), reraise=True):
            with attempt:
                return once()
    except TRANSIENT as e:
        if out_of_capacity(e):
            raise CapacityProviderError(f"Cloud Run API: quota exceeded: {getattr(e, 'message', e)}") from e
        raise TransientProviderError(f"Cloud Run API: {type(e).__name__}: {getattr(e, 'message', e)}") from e
    except gexc.GoogleAPICallError as e:
        raise PermanentProviderError(f"Cloud Run API: {type(e).__name__}: {e.message}") from e
    return None  # pragma: no cover
