"""The catalog file as a running server watches it (docs/design/catalog-reload.md).

`CatalogWatch.changed()` answers the file's new text when its content differs from what the
server last loaded or refused, else None: a `stat` per look, and a read and a hash only once the
file's size, mtime or inode moved (an editor's save, an atomic rename, a ConfigMap's symlink
swap). `CatalogStatus` is what the operator sees of it: which revision is loaded, since when, and
the problems of the last file refused, if the file has not been mended since.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CatalogStatus:
    source: str
    revision: int = 1  # 1 at start, one more per catalog taken while running
    loaded_at: float = field(default_factory=time.time)
    reloads: bool = False  # False: the catalog changes only with a restart (inline, or reloading off)
    refused_at: float | None = None  # the last file refused, while the file is still that one
    problems: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "revision": self.revision, "loaded_at": self.loaded_at,
                "reloads": self.reloads, "refused_at": self.refused_at, "problems": list(self.problems)}


class CatalogWatch:
    def __init__(self, path: Path):
        self.path = path
        self._stat = self._signature()
        self._digest = self._hash(self._read())

    def changed(self) -> str | None:
        """The file's text when it changed since the last call (None: the same, or unreadable now:
        an editor may be half-way through a save; the next look sees the end of it)."""
        signature = self._signature()
        if signature == self._stat:
            return None
        text = self._read()
        if text is None:
            return None
        self._stat = signature
        digest = self._hash(text)
        if digest == self._digest:
            return None
        self._digest = digest
        return text

    def _signature(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns

    def _read(self) -> str | None:
        try:
            return self.path.read_bytes().decode(errors="replace")  # not UTF-8: the parser says where
        except OSError:
            return None

    @staticmethod
    def _hash(text: str | None) -> str | None:
        return None if text is None else hashlib.sha256(text.encode()).hexdigest()
