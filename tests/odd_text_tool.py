"""`odd_text`: a test tool whose output holds text not every store keeps as it is.

It prints a line with NUL (U+0000) on stdout and on stderr, reports progress whose message and
phase hold NUL, declares an artifact whose kind holds NUL, and returns its input `echo` as its
result. PostgreSQL's text cannot hold NUL and SQLite's can: the control plane keeps the output
alike on both (NUL becomes U+FFFD in what is stored as text, a label no column keeps becomes the
default), while the inputs and the result, kept as JSON, come back exactly as they were.
"""

from __future__ import annotations

import sys
from pathlib import Path

from controlplane_runner import toolkit

# The tool runs as a module of tests/, which is not an installed package: its PYTHONPATH names the checkout.
CHECKOUT = str(Path(__file__).resolve().parent.parent)
CATALOG_ENTRY = """
[tools.odd_text]
description = "A test tool whose output holds NUL characters."
resource_class = "cpu_small"
command = ["{python}", "-m", "tests.odd_text_tool"]
env = { PYTHONPATH = "@CHECKOUT@" }
estimate_s = 1

[tools.odd_text.input_schema]
type = "object"
additionalProperties = false
properties.echo = { type = "string" }
""".replace("@CHECKOUT@", CHECKOUT)


def main() -> int:
    echo = toolkit.inputs().get("echo", "")
    print(f"out\x00{echo}", flush=True)
    print("err\x00", file=sys.stderr, flush=True)
    toolkit.progress(50.0, phase="ph\x00ase", message="half\x00way")
    toolkit.artifact("odd.txt", kind="k\x00ind").write_text("x\x00y")
    toolkit.result({"echo": echo})
    return 0


if __name__ == "__main__":
    sys.exit(main())
