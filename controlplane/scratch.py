"""Whether a task's input files fit its job's scratch disk, where the runner puts them: a pure
decision, made by admission for the sizes it knows and by the release of a waiting task for the
artifacts of its parents that had no size before (docs/design/references.md)."""

from __future__ import annotations

from collections.abc import Mapping

MIB = 1024 * 1024


def overflow(sizes: Mapping[str, int], scratch_mb: int | None, class_scratch_mb: int | None,
             class_name: str) -> tuple[str, str] | None:
    """(message, hint) when files of these sizes (field -> bytes) cannot fit the job's scratch
    disk: more than the task's `resources.scratch_mb` when it asks for some, else than its
    resource class's `scratch_mb` when the class caps it; None when they fit or nothing caps them."""
    total = sum(sizes.values())
    if not total:
        return None
    need = -(-total // MIB)
    room, what = (scratch_mb, f"resources.scratch_mb={scratch_mb}") if scratch_mb else \
        (class_scratch_mb, f"the {class_scratch_mb} MiB of scratch disk resource class '{class_name}' allows")
    if room is None or need <= room:
        return None
    each = ", ".join(f"inputs.{f} {n} bytes" for f, n in sorted(sizes.items()))
    return (f"the input files take {total} bytes ({need} MiB: {each}), more than {what}",
            f"ask for resources.scratch_mb of at least {need} plus what the tool writes, or pass smaller files")
