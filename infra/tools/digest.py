"""`digest`: a test tool that reads a file input (`toolkit.input_path("data")`), answers its size
and sha256, and writes a copy with `suffix` appended as the artifact "out.bin", so that a later
task can read it by reference (no copy when the input `copy` is false)."""

from __future__ import annotations

import hashlib
import os

from controlplane_runner import toolkit


def main() -> None:
    path = toolkit.input_path("data")
    suffix = str(toolkit.inputs().get("suffix", "")).encode()
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as src, open(toolkit.artifact("out.bin") if toolkit.inputs().get("copy", True)
                                       else os.devnull, "wb") as out:
        while chunk := src.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
            out.write(chunk)
        out.write(suffix)
    toolkit.result({"size_bytes": size, "sha256": sha.hexdigest(), "path_is_local": path.is_file()})


if __name__ == "__main__":
    main()
