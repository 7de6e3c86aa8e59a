"""Azure Resource Manager calls: credentials, the shared limiters, the start's retry rule, and errors.

ARM limits reads and writes per subscription and principal: every HTTP try holds a place in a
shared limiter for its kind, and azure-core's retry honours Retry-After. A 429 or 5xx that
outlasts the retries is a TransientProviderError. An answer refusing for quota or capacity
(ARM's QuotaExceeded, ResourceQuotaExceeded, AllocationFailed, ZonalAllocationFailed, an
OperationNotAllowed that names a quota, or Container Apps' "Maximum Allowed Cores exceeded for
the Managed Environment") is a CapacityProviderError.
"""

from __future__ import annotations

import time
from typing import Any

from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from azure.core.pipeline.policies import RetryPolicy
from azure.core.rest import HttpRequest, HttpResponse

from controlplane_providers import ratelimit
from controlplane_providers.errors import CapacityProviderError, PermanentProviderError, TransientProviderError

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
AZURE_ERRORS = (HttpResponseError, ServiceRequestError, ServiceResponseError)  # what azure-core raises for a call
CAPACITY_CODES = {"QuotaExceeded", "ResourceQuotaExceeded", "AllocationFailed", "ZonalAllocationFailed"}
CORES_EXCEEDED = "Maximum Allowed Cores exceeded"  # Container Apps' environment core quota


class PlaceholderCredential:
    """A token for local fakes (`ANONYMOUS`): azure-core sends bearer tokens only over https."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("anonymous", int(time.time()) + 3600)


class LimiterPolicy:
    """An azure-core per-retry policy: every HTTP try holds a place in the limiter of its kind
    (reads: GET/HEAD; writes: the rest) from before it is sent until it has ended."""

    next: Any = None

    def __init__(self, reads: ratelimit.SlidingWindowLimiter, writes: ratelimit.SlidingWindowLimiter):
        self.reads, self.writes = reads, writes

    def send(self, request: Any) -> Any:
        method = request.http_request.method.upper()
        with ratelimit.held(self.reads if method in ("GET", "HEAD") else self.writes) as held:
            response = self.next.send(request)
            held.status = response.http_response.status_code
            return response


class StartRetriedOnlyOn429(RetryPolicy[HttpRequest, HttpResponse]):
    """azure-core retries a POST on 500/503/504, and any answer that carries Retry-After. A job
    start that failed that way may have created its execution, so a start is retried in place
    only on 429; the control plane's launch retry calls `find` first."""

    def is_retry(self, settings: dict[str, Any], response: Any) -> bool:
        request = response.http_request
        if request.method.upper() == "POST" and request.url.split("?", 1)[0].endswith("/start"):
            status: int = response.http_response.status_code
            return status == 429
        return super().is_retry(settings, response)


def classify(e: Exception, what: str) -> Exception:
    if isinstance(e, ServiceRequestError | ServiceResponseError):
        return TransientProviderError(f"{what}: {type(e).__name__}")
    if isinstance(e, HttpResponseError):
        code = getattr(e.error, "code", None)
        message = str(getattr(e.error, "message", None) or e.message or "")
        if code in CAPACITY_CODES or CORES_EXCEEDED in message or (
                code == "OperationNotAllowed" and "quota" in message.lower()):
            return CapacityProviderError(f"{what}: HTTP {e.status_code} {code or ''}: {message}")
        if (e.status_code or 0) in TRANSIENT_STATUS:
            return TransientProviderError(f"{what}: HTTP {e.status_code} {code or ''}".rstrip())
        return PermanentProviderError(f"{what}: HTTP {e.status_code} {code or ''}: {e.message}")
    return e
