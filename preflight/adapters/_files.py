"""What the file adapters (`keystore`, `replay_file`) write the same way: a new private file, whole on disk."""

from __future__ import annotations

import os
from pathlib import Path


def write_new_private(path: Path, data: bytes | bytearray) -> None:
    """Create `path` (mode 0600; it must not exist yet), write `data` and flush it to disk.

    :raises OSError: when it exists or cannot be written (`FileExistsError` for the first).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
