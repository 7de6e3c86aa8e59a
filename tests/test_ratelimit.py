"""The client-side rate limiter bounds what the service sees: however long requests spend in
flight, no one-second window holds more than `rate` arrivals."""

from __future__ import annotations

import random
import threading
import time

from controlplane_providers.ratelimit import SlidingWindowLimiter
from tests.conftest import most_in_one_second


def test_arrivals_never_exceed_the_rate_in_any_second() -> None:
    limiter = SlidingWindowLimiter(rate=5)
    arrivals: list[float] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(4):
            token = limiter.acquire()
            start = time.monotonic()
            flight = rng.choice([0.0, 0.05, 0.3, 0.8])  # some requests linger before they arrive
            time.sleep(flight * rng.random())
            with lock:
                arrivals.append(time.monotonic())
            time.sleep(flight - (time.monotonic() - start) if flight > time.monotonic() - start else 0)
            limiter.release(token)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(arrivals) == 24 and limiter.calls == 24
    assert most_in_one_second(arrivals) <= 5


def test_a_limiter_counts_waits_throttling_and_errors_for_the_metrics() -> None:
    from controlplane.ops.metrics import LimiterCollector
    from controlplane_providers import ratelimit

    limiter = ratelimit.shared(ratelimit.key("counted", account="acct", region="r1"), rate=1, window_s=0.2)

    class TooMany(Exception):
        code = 429

    with ratelimit.held(limiter) as request:
        request.status = 200
    try:
        with ratelimit.held(limiter):  # waits for the window: one place per 0.2 s
            raise TooMany()
    except TooMany:
        pass
    with ratelimit.held(limiter) as request:
        request.status = 503
    assert (limiter.calls, limiter.waits, limiter.rate_limited, limiter.errors) == (3, 2, 1, 2)
    assert limiter.waited_s > 0
    samples = {(s.name, s.labels.get("api")): s.value for fam in LimiterCollector().collect() for s in fam.samples}
    assert samples[("controlplane_provider_requests_total", "counted")] == 3
    assert samples[("controlplane_provider_throttled_total", "counted")] == 2
    assert samples[("controlplane_provider_rate_limited_total", "counted")] == 1
    assert samples[("controlplane_provider_request_errors_total", "counted")] == 2


def test_a_session_under_a_quota_adapter_sends_no_request_without_a_place() -> None:
    """Every HTTP request a session sends holds a place (retries and read-aheads of an SDK
    included); without a place free it is not sent at all."""
    import pytest
    import requests

    from controlplane_providers import ratelimit
    from tests.gcp import FakeCloudRun

    limiter = SlidingWindowLimiter(rate=2, window_s=60)
    with FakeCloudRun() as fake:
        session = ratelimit.limit_session(requests.Session(), limiter)
        for _ in range(2):
            assert session.get(f"{fake.url}/v2/projects/p/locations/r/jobs/nope").status_code == 404
        with pytest.raises(ratelimit.OverQuota) as refused:
            session.get(f"{fake.url}/v2/projects/p/locations/r/jobs/nope")
        assert len(fake.requests) == 2 and limiter.calls == 2 and limiter.errors == 2
        assert 0 < refused.value.wait_s <= 60
