"""`steady`: a test tool whose progress does everything that can make a progress value repeat.

Attempts up to `fail_attempts` report 20 % and 60 % and fail (the catalog entry retries them,
and a retry starts its percent again from zero). The last attempt reports 10 %, then 50 % four
times with a different message each time, goes quiet for `quiet_s` (a keep-alive spell), reports
50 % once more, then 30 % (a step back), then 100 %, and stays quiet at 100 % for `quiet_s` / 2
before it ends. `gap_s` separates the reports (above the 0.25 s throttle, so none is coalesced).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from controlplane_runner import toolkit

# The tool runs as a module of tests/, which is not an installed package: its PYTHONPATH names the checkout.
CHECKOUT = str(Path(__file__).resolve().parent.parent)
CATALOG_ENTRY = """
[tools.steady]
description = "A test tool whose percent repeats, goes quiet, steps back and restarts on a retry."
resource_class = "cpu_small"
command = ["{python}", "-m", "tests.steady_tool"]
env = { PYTHONPATH = "@CHECKOUT@" }
estimate_s = 5
retry = { max_attempts = 3, backoff_s = 0, retry_on = ["tool_failed"] }

[tools.steady.input_schema]
type = "object"
additionalProperties = false
properties.fail_attempts = { type = "integer", minimum = 0, maximum = 2, default = 0 }
properties.gap_s = { type = "number", minimum = 0, maximum = 10, default = 0.35 }
properties.quiet_s = { type = "number", minimum = 0, maximum = 60, default = 1.5 }
""".replace("@CHECKOUT@", CHECKOUT)


def main() -> int:
    inp = toolkit.inputs()
    gap = float(inp.get("gap_s", 0.35))
    quiet = float(inp.get("quiet_s", 1.5))
    attempt = int(os.environ.get("CONTROLPLANE_ATTEMPT", "1"))
    if attempt <= int(inp.get("fail_attempts", 0)):
        for percent in (20, 60):
            time.sleep(gap)
            toolkit.progress(percent, phase="doomed", message=f"attempt {attempt}")
        time.sleep(gap)
        return 1
    toolkit.progress(10, phase="steady", message=f"attempt {attempt}")
    for word in ("reading", "parsing", "checking", "indexing"):
        time.sleep(gap)
        toolkit.progress(50, phase="steady", message=word)
    time.sleep(quiet)
    toolkit.progress(50, phase="steady", message="still half way")
    time.sleep(gap)
    toolkit.progress(30, phase="steady", message="a step back")
    time.sleep(gap)
    toolkit.progress(100, phase="steady", message="writing up")
    time.sleep(quiet / 2)
    toolkit.result({"ok": True, "attempt": attempt})
    return 0


if __name__ == "__main__":
    sys.exit(main())
