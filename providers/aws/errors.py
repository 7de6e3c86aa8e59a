"""AWS Batch and CloudWatch Logs errors as the core's classes.

Batch answers ClientException (the request is wrong) or ServerException; throttling comes as a
429 or one of the throttling codes. SubmitJob has no error for capacity: a job queue whose
compute environments cannot scale takes the job and leaves it RUNNABLE, which `poll` reports
as waiting (and gives up on per the catalog's `on_stuck`). So nothing here is a
CapacityProviderError.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from controlplane_providers.errors import PermanentProviderError, TransientProviderError

THROTTLING_CODES = {"TooManyRequestsException", "ThrottlingException", "RequestLimitExceeded"}
TRANSIENT_CODES = THROTTLING_CODES | {"ServerException", "ServiceUnavailable", "InternalFailure"}


def _code_and_status(e: ClientError) -> tuple[str, int]:
    return (str(e.response.get("Error", {}).get("Code", "")),
            int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0))


def throttled(e: BaseException) -> bool:
    """Refused for the rate before anything was done: safe to send again as it was."""
    if not isinstance(e, ClientError):
        return False
    code, status = _code_and_status(e)
    return code in THROTTLING_CODES or status == 429


def classify(e: Exception) -> Exception:
    """A Batch/Logs error as the core's transient (retry later) or permanent (wrong request)."""
    if isinstance(e, ClientError):
        code, status = _code_and_status(e)
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientProviderError(f"{code or status}: {e}")
        return PermanentProviderError(f"{code}: {e.response.get('Error', {}).get('Message', e)}")
    if isinstance(e, BotoCoreError):
        return TransientProviderError(str(e))
    return e
