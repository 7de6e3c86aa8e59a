"""The task's inputs made ready before the tool starts: the inputs document read from the object
store, and the files it refers to made local (`controlplane_runner.materialize`) through the
runner's own store access or through grants the control plane signs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import ObjectStore, inputs_key
from controlplane_runner import materialize
from controlplane_runner.granted import GrantedStore


def fetch_inputs(store: ObjectStore | None, ref: AttemptRef) -> dict[str, Any]:
    """The attempt's inputs ({} without a store); raises when they cannot be read or are not a
    JSON object."""
    if store is None:
        return {}
    data = json.loads(store.get_bytes(inputs_key(ref)))
    if not isinstance(data, dict):
        raise ValueError("inputs are not a JSON object")
    return data


def materialize_files(store: ObjectStore | None, store_url: str | None, ref: AttemptRef,
                      inputs: dict[str, Any], workdir: Path, *, has_files: bool) -> None:
    """The input files under `workdir`, each input value that names one replaced by its local
    path; nothing unless the launch said the task has file inputs (`has_files`). Raises when a
    file cannot be read or does not match what admission recorded."""
    if store is None or not has_files:
        return
    files = materialize.manifest(store, ref)
    if files:
        granted = store if isinstance(store, GrantedStore) else None
        open_ = (lambda field, _f: granted.open_input(field)) if granted is not None \
            else materialize.opener(store, store_url)
        n = materialize.materialize(files, inputs, workdir, open_)
        print(f"# {len(files)} input file(s) materialized ({n} bytes)", flush=True)
