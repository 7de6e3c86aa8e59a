"""Upload throughput: `python bench/uploads.py [--size-mb 1024] [--quick]`.

For each object store (the local directory through the control plane's signed PUT route, S3 on
moto's server, GCS on gcp-storage-emulator, Azure Blob on azurite when it is installed) a
`controlplane serve` process is started on 127.0.0.1 with that store as its default, and one file
is uploaded twice in the same run:

* by `controlplane put FILE` in a subprocess, all of it as a user runs it: hashing the file,
  `create_upload`, the bytes sent by the store's plan (one PUT, `Content-Range` chunks, S3 parts,
  a GCS session or Azure blocks), and `complete_upload`, where the server reads the object back
  and hashes it;
* by the store's own client copying the same file, in this process: a plain file copy
  (`shutil.copyfile`) for the local directory, boto3's `upload_file`, google-cloud-storage's
  `blob.upload_from_filename`, azure-storage-blob's `upload_blob`.

It prints MiB/s for each and the ratio (the client's time over put's: 1.0 is as fast as the
store's own client, lower is slower). `put` pays a fixed cost whatever the size (starting Python,
two MCP calls, hashing and reading back are not fixed but are not the copy either), so the table
also gives the time of a 1 KiB put (best of two) and the rate of what the size adds (`put - put
of 1 KiB`), with its ratio: at small sizes that difference is within the noise of a loaded
machine, read it at `--size-mb 1024`. Then the CLI's peak RSS (VmHWM read at its exit) for the
file and for a 1 KiB file, whose difference is what the size of the file costs in memory. The
default size takes well under a minute all told on 2 cores; `--size-mb 1024` gives the real
figure. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/...` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from tests import cloud  # noqa: E402
from tests.measured import Figures, run_cli  # noqa: E402
from tests.test_uploads import make_file  # noqa: E402

MIB = 1024 * 1024
TOKEN = "tok-bench"


def store_client_copy(target: cloud.CloudTarget, source: Path, tmpdir: Path) -> Callable[[], None]:
    """The store's own client copying `source` to a fresh key, as a function to time."""
    kind, rest = target.url.split("://", 1)
    if target.name == "local":
        return lambda: shutil.copyfile(source, tmpdir / "copy.bin")
    if target.name == "s3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=target.env["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing-secret")
        return lambda: s3.upload_file(str(source), rest.split("/")[0], "baseline/copy.bin")
    if target.name == "gcs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        gcs = storage.Client(project="controlplane-test", credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": target.env["STORAGE_EMULATOR_HOST"]})
        blob = gcs.bucket(rest.split("/")[0]).blob("baseline/copy.bin")
        return lambda: blob.upload_from_filename(str(source))
    from azure.storage.blob import BlobServiceClient

    account, container = rest.split("/")[:2]
    service = BlobServiceClient(target.env["AZURE_STORAGE_BLOB_ENDPOINT"],
                                credential={"account_name": account, "account_key": cloud.AZURITE_KEY})
    blob_client = service.get_blob_client(container, "baseline/copy.bin")

    def azure_copy() -> None:
        with open(source, "rb") as f:
            blob_client.upload_blob(f, overwrite=True)
    return azure_copy


def put(url: str, path: Path) -> tuple[float, Figures]:
    t0 = time.perf_counter()
    fig = run_cli(["put", str(path), "--url", url, "--token", TOKEN])
    seconds = time.perf_counter() - t0
    if fig.returncode != 0 or "upload://upl_" not in fig.stdout:
        raise RuntimeError(f"controlplane put failed ({fig.returncode}): {fig.stderr[-2000:]}")
    return seconds, fig


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from tests.conftest import ServerProcess, fast_env

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="16 MiB whatever --size-mb says")
    args = ap.parse_args()
    size = (16 if args.quick else args.size_mb) * MIB
    console = Console(stderr=True)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cp-bench-uploads-") as tmp, ExitStack() as stack:
        tmpdir = Path(tmp)
        source, small = tmpdir / "data.bin", tmpdir / "small.bin"
        console.log(f"writing a {size / MIB:.0f} MiB file")
        make_file(source, size, b"bench")
        make_file(small, 1024, b"small")
        targets = {"local": cloud.CloudTarget("local", (tmpdir / "store").as_uri())}
        targets["s3"] = cloud.s3_target(stack.enter_context(cloud.moto_s3()))
        targets["gcs"] = cloud.gcs_target(stack.enter_context(cloud.gcs_emulator()), tmpdir)
        if cloud.azurite_binary():
            targets["azure"] = cloud.azure_target(stack.enter_context(cloud.azurite(tmpdir / "azurite")))
        else:
            console.log("azurite not installed: Azure Blob skipped (npm install azurite)")
        for name, target in targets.items():
            home = tmpdir / f"home-{name}"
            env = fast_env(home, auth_tokens=f"{TOKEN}=bench", object_store_url=target.url)
            server = ServerProcess(home, {**env, **target.env}).start()
            try:
                assert server.url is not None
                console.log(f"{name}: the store's client, then controlplane put")
                copy = store_client_copy(target, source, tmpdir)
                t0 = time.perf_counter()
                copy()
                client_s = time.perf_counter() - t0
                put_s, fig = put(server.url, source)
                small_s, small_fig = min((put(server.url, small) for _ in range(2)), key=lambda r: r[0])  # best of two
            finally:
                server.stop()
            results[name] = {"client_s": client_s, "put_s": put_s, "client_mib_s": size / MIB / client_s,
                             "put_mib_s": size / MIB / put_s, "ratio": client_s / put_s,
                             "small_put_s": small_s, "marginal_mib_s": size / MIB / (put_s - small_s),
                             "marginal_ratio": client_s / (put_s - small_s), "peak_rss_mib": fig.peak_rss_mib,
                             "small_peak_rss_mib": small_fig.peak_rss_mib,
                             "rss_growth_mib": fig.peak_rss_mib - small_fig.peak_rss_mib}

    table = Table(title=f"one {size / MIB:.0f} MiB file into each store: controlplane put against the store's client")
    for col in ("store", "client MiB/s", "put MiB/s", "ratio", "put 1 KiB", "added MiB/s", "ratio ",
                "peak RSS", "1 KiB: peak"):
        table.add_column(col, justify="left" if col == "store" else "right")
    for name, r in results.items():
        table.add_row(name, f"{r['client_mib_s']:.0f}", f"{r['put_mib_s']:.0f}", f"{r['ratio']:.2f}x",
                      f"{r['small_put_s']:.2f} s", f"{r['marginal_mib_s']:.0f}",
                      f"{r['marginal_ratio']:.2f}x", f"{r['peak_rss_mib']:.1f} MiB", f"{r['small_peak_rss_mib']:.1f} MiB")
    Console(width=max(Console().width, 120)).print(table)
    print(json.dumps({"benchmark": "uploads", "size_bytes": size, "results": results, "time": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
