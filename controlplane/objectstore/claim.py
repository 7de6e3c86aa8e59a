"""The attempt's claim: which one execution of an attempt may run its tool.

A second execution of one attempt can start (a leader paused past its lease launches again, a
launch retried while the cloud's list lags, a cloud's own container retry). Its runner must not
run the tool. The claim is one object, `claim.json` under the attempt's prefix, written
create-only, so the object store grants it to exactly one nonce (the digest of a random string
the runner chose). The control plane's claim route takes it on the runner's behalf; a runner that
cannot reach the control plane takes it itself. Either way the first writer holds it, and every
other execution is refused. Standard library only (the runner imports it).
"""

from __future__ import annotations

import hashlib
import json
import time

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import ObjectExists, ObjectStore, attempt_prefix


def claim_key(ref: AttemptRef) -> str:
    return f"{attempt_prefix(ref)}claim.json"


def nonce_digest(nonce: str) -> str:
    """What is kept of a claim's nonce (the nonce itself never rests anywhere)."""
    return hashlib.sha256(nonce.encode()).hexdigest()


def take_claim(store: ObjectStore, ref: AttemptRef, digest: str, *, by: str) -> str:
    """Claim the attempt for `digest`, or learn who holds it: the digest that holds the claim
    (`digest` itself when it is ours, now or from an earlier try with the same nonce). `by` says
    who wrote it ("control-plane" or "runner"), for an operator reading the object. Raises
    OSError when the store cannot be reached. Blocks (one write, and one read if taken)."""
    key = claim_key(ref)
    doc = {"nonce_sha256": digest, "claimed_at": time.time(), "by": by}
    try:
        store.put_bytes(key, json.dumps(doc).encode(), content_type="application/json")
        return digest
    except ObjectExists:
        pass
    try:
        held = json.loads(store.get_bytes(key)).get("nonce_sha256")
    except (ValueError, AttributeError):
        held = None
    return held if isinstance(held, str) else ""
