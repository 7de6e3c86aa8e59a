"""One value names an attempt: the strings derived from it are the ones a deployed control plane
already made (job names, object keys, credentials, routes, the runner's environment), so running
jobs and stored objects still match after an upgrade; a shard gets names of its own."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from controlplane.ids import AttemptRef
from controlplane.launch import bootstrap_token, runner_secret
from controlplane.objectstore.base import (
    artifact_key,
    attempt_prefix,
    events_key,
    events_prefix,
    inputs_key,
    result_key,
)
from controlplane.objectstore.claim import claim_key

KEY = b"k" * 32
# Computed with the (task id, attempt) functions before they took an AttemptRef.
PINNED = {
    ("tsk_2n5q7xw4bcabcdefghijklmnop", 1): {
        "job": "cp-2n5q7xw4bcabcdefghijklmnop-a1",
        "secret": "3463c5943ff25ab2ef2150494a0c865dd730aca86812e401773fd1661b2c9a5e",
        "bootstrap": "3c60e126473d7f398ad64d13ac6895aa8c2bd5ad54daf6945972c86206ba7498",
    },
    ("tsk_0000000000zzzzzzzzzzzzzzzz", 12): {
        "job": "cp-0000000000zzzzzzzzzzzzzzzz-a12",
        "secret": "3ac36d478353f1aec4240411b68a0d95ffada7c970c45cd7dbcd8e571e84e115",
        "bootstrap": "13ca5c8f14feaa9d721259da13bc7bf3bda19295e3ba8bc20c8b83b546b69173",
    },
}


@pytest.mark.parametrize(("task_id", "n"), list(PINNED))
def test_an_attempt_derives_the_strings_a_deployed_control_plane_made(task_id: str, n: int) -> None:
    ref, want = AttemptRef(task_id, n), PINNED[(task_id, n)]
    base = f"tasks/{task_id}/attempts/{n}/"
    assert ref.job_name == want["job"]
    assert runner_secret(KEY, ref) == want["secret"]
    assert bootstrap_token(KEY, ref) == want["bootstrap"]
    assert attempt_prefix(ref) == base
    assert inputs_key(ref) == base + "inputs.json"
    assert result_key(ref) == base + "result.json"
    assert events_prefix(ref) == base + "events/"
    assert events_key(ref, 37) == base + "events/000000000037.jsonl"
    assert artifact_key(ref, "out/plot.png") == base + "artifacts/out/plot.png"
    assert claim_key(ref) == base + "claim.json"
    assert ref.path == f"tasks/{task_id}/attempts/{n}"  # the runner routes' /runner/v1/<path>/claim
    assert ref.to_env() == {"CONTROLPLANE_TASK_ID": task_id, "CONTROLPLANE_ATTEMPT": str(n)}
    assert AttemptRef.from_env(ref.to_env()) == ref


def test_a_runner_told_no_attempt_runs_the_first() -> None:
    assert AttemptRef.from_env({"CONTROLPLANE_TASK_ID": "tsk_x"}) == AttemptRef("tsk_x", 1)


def test_a_shard_has_names_and_credentials_of_its_own() -> None:
    task_id = "tsk_2n5q7xw4bcabcdefghijklmnop"
    plain, shards = AttemptRef(task_id, 1), [AttemptRef(task_id, 1, s) for s in (0, 1, 10)]
    for derive in (lambda r: r.job_name, lambda r: r.path, attempt_prefix, lambda r: runner_secret(KEY, r),
                   lambda r: bootstrap_token(KEY, r)):
        names = [derive(r) for r in (plain, *shards)]
        assert len(set(names)) == len(names)
    s = shards[2]
    assert s.job_name == "cp-2n5q7xw4bcabcdefghijklmnop-a1-s10" and len(s.job_name) <= 63
    assert attempt_prefix(s) == f"tasks/{task_id}/attempts/1/shards/10/"
    assert s.path == f"tasks/{task_id}/attempts/1/shards/10"
    assert runner_secret(KEY, s) == hmac.new(KEY, f"controlplane/runner\n{task_id}\n1\n10".encode(),
                                             hashlib.sha256).hexdigest()
    assert AttemptRef.from_env(s.to_env()) == s and s.to_env()["CONTROLPLANE_SHARD"] == "10"
