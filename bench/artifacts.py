"""Artifact uploads stream: `python bench/artifacts.py [--size-mb 1024] [--quick]`.

For each object store (the local directory, S3 on moto's server, GCS on gcp-storage-emulator,
Azure Blob on azurite when it is installed) a fresh process uploads one file of the given size
through the store interface, exactly as the runner uploads an artifact (`put_file`: read in
chunks, hash while streaming, multipart / resumable / block upload), and reports its own peak
RSS (`ru_maxrss`), the time taken and the sha256. The same process first measures its peak RSS
with the SDK imported and the client made, nothing uploaded: the difference is what the upload itself costs,
which must not grow with the file. The emulators run in other processes (or, for moto, in this
one), so their memory is not counted.

Prints a table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The peak is read from /proc/self/status (VmHWM), which starts afresh at exec; ru_maxrss would
# carry over the parent's peak on Linux.
UPLOADER = r"""
import json, sys, time
from controlplane.objectstore import open_store

def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

store = open_store(sys.argv[1])
baseline = peak_mb()
t0 = time.perf_counter()
info = store.put_file("bench/artifact.bin", sys.argv[2], content_type="application/octet-stream")
print(json.dumps({"seconds": time.perf_counter() - t0, "size": info.size_bytes, "sha256": info.sha256,
                  "baseline_rss_mb": baseline, "peak_rss_mb": peak_mb()}))
"""


def make_file(path: Path, size: int) -> str:
    sha = hashlib.sha256()
    block = hashlib.sha256(b"artifact").digest() * 32768  # 1 MiB
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = block[: min(left, len(block))]
            f.write(chunk)
            sha.update(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def upload(url: str, path: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", UPLOADER, url, str(path)], env={**os.environ, **env},
                         capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from tests import cloud

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="128 MiB instead of the full size")
    args = ap.parse_args()
    size = (128 if args.quick else args.size_mb) * 1024 * 1024
    console = Console(stderr=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cp-bench-artifacts-") as tmp, ExitStack() as stack:
        tmpdir = Path(tmp)
        source = tmpdir / "artifact.bin"
        console.log(f"writing a {size / 2**20:.0f} MiB file")
        expected = make_file(source, size)
        targets = {"local": cloud.CloudTarget("local", (tmpdir / "store").as_uri())}
        targets["s3"] = cloud.s3_target(stack.enter_context(cloud.moto_s3()))
        targets["gcs"] = cloud.gcs_target(stack.enter_context(cloud.gcs_emulator()), tmpdir)
        if cloud.azurite_binary():
            targets["azure"] = cloud.azure_target(stack.enter_context(cloud.azurite(tmpdir / "azurite")))
        else:
            console.log("azurite not installed: Azure Blob skipped (npm install azurite)")
        for name, target in targets.items():
            console.log(f"uploading through {name} ({target.url})")
            r = upload(target.url, source, target.env)
            r["sha256_ok"] = r["sha256"] == expected and r["size"] == size
            r["upload_rss_mb"] = r["peak_rss_mb"] - r["baseline_rss_mb"]
            r["mib_per_s"] = size / 2**20 / r["seconds"]
            results[name] = r

    table = Table(title=f"one {size / 2**20:.0f} MiB artifact through each object store (uploader process)")
    for col in ("store", "seconds", "MiB/s", "peak before", "peak RSS", "upload cost", "sha256"):
        table.add_column(col, justify="right" if col not in ("store", "sha256") else "left")
    for name, r in results.items():
        table.add_row(name, f"{r['seconds']:.1f}", f"{r['mib_per_s']:.0f}", f"{r['baseline_rss_mb']:.0f} MB",
                      f"{r['peak_rss_mb']:.0f} MB", f"{r['upload_rss_mb']:.0f} MB",
                      "match" if r["sha256_ok"] else "MISMATCH")
    Console().print(table)
    print(json.dumps({"benchmark": "artifact-streaming", "size_bytes": size, "quick": args.quick,
                      "results": results, "time": time.time()}))
    return 0 if all(r["sha256_ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
