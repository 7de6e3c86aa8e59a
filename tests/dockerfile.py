"""Reading a Dockerfile the way a build would, for the image tests (no Docker engine here)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), backslash-continued lines joined, comments and blanks dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        op, _, rest = line.partition(" ")
        out.append((op.upper(), " ".join(rest.split())))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    """The instructions of the last build stage (what the image is)."""
    found = instructions(path)
    last_from = max(i for i, (op, _) in enumerate(found) if op == "FROM")
    return found[last_from:]


def env(path: Path) -> dict[str, str]:
    """The ENV of the final stage, as the image's processes see it."""
    out: dict[str, str] = {}
    for op, rest in final_stage(path):
        if op == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                out[key] = value
    return out


def exec_form(path: Path, instruction: str) -> list[str]:
    """The JSON (exec) form of CMD, ENTRYPOINT or HEALTHCHECK's CMD in the final stage."""
    [rest] = [rest for op, rest in final_stage(path) if op == instruction]
    return list(json.loads(rest[rest.index("CMD ") + 4:] if instruction == "HEALTHCHECK" else rest))


def copies(path: Path, root: Path) -> list[tuple[Path, str]]:
    """(source in the build context, destination) of every COPY that is not from another stage."""
    found = []
    for op, rest in instructions(path):
        if op == "COPY" and not rest.startswith("--from"):
            *sources, dest = shlex.split(rest)
            found += [(root / src, dest) for src in sources]
    return found


def volumes(path: Path) -> list[str]:
    """The paths the final stage declares a VOLUME (JSON or plain form)."""
    found: list[str] = []
    for op, rest in final_stage(path):
        if op == "VOLUME":
            found += volumes_of(rest)
    return found


def user(path: Path) -> tuple[int, int]:
    """(uid, gid) of the final stage's last USER, which must be numeric (uid[:gid])."""
    [*_, last] = [rest for op, rest in final_stage(path) if op == "USER"]
    uid, _, gid = last.partition(":")
    return int(uid), int(gid or uid)


def made_before_volume(path: Path, volume: str) -> tuple[int, int, str] | None:
    """(uid, gid, mode) of the `install -d -o UID -g GID -m MODE PATH` by which a RUN before the
    VOLUME line makes that volume's directory (None if none does: changes after VOLUME are lost)."""
    stage = final_stage(path)
    declared = next(i for i, (op, rest) in enumerate(stage) if op == "VOLUME" and volume in volumes_of(rest))
    for op, rest in stage[:declared]:
        if op == "RUN":
            for command in rest.split("&&"):
                words = shlex.split(command)
                if words[:2] == ["install", "-d"] and words[-1] == volume:
                    options = dict(zip(words[2:-1:2], words[3:-1:2], strict=True))
                    return int(options["-o"]), int(options["-g"]), options.get("-m", "0755")
    return None


def volumes_of(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else rest.split()
