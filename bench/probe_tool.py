"""`progress_probe`: a tool for the progress-latency benchmark (bench/protocol.py).

Reports `steps` progress steps, `interval_s` apart; each report's message is the wall-clock time
at which the tool made it (`t=<epoch seconds>`), so the client that receives the notification can
tell how long the report took to reach it (same machine, same clock).
"""

from __future__ import annotations

import time

from controlplane_runner import toolkit


def main() -> int:
    inp = toolkit.inputs()
    steps, interval = int(inp.get("steps", 10)), float(inp.get("interval_s", 0.5))
    for s in range(1, steps + 1):
        time.sleep(interval)
        toolkit.progress(step=s, step_total=steps, message=f"t={time.time():.6f}")
    toolkit.result({"steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
