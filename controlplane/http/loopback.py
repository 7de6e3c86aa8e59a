"""Whether a host name or address is this machine's own: the HTTP app binds anywhere else only
with auth, and the dashboard and /metrics answer loopback clients only unless opened."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    """True for a loopback name or any loopback address (127.0.0.0/8, ::1)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
