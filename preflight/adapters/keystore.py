"""`FileKeyStore`: per-subject keys in a directory (the `preflight.ports.KeyStore` port's file adapter)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path

from preflight.adapters._files import write_new_private
from preflight.chain import canonical_json
from preflight.errors import KeyStoreError, UnknownKey, ValueErased
from preflight.keys import KEY_BYTES as _KEY_BYTES
from preflight.keys import SubjectKey, make_kid, parse_kid, subject_handle

__all__ = ["FileKeyStore"]


#: A file's identity: (inode, device, mode, size, mtime ns, ctime ns), or None when it is absent.
_Identity = tuple[int, int, int, int, int, int] | None
_Stamp = tuple[_Identity, _Identity]


def _identity(path: Path) -> _Identity:
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyStoreError(f"cannot read key file {path.name}: {exc.strerror}") from exc
    return (info.st_ino, info.st_dev, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _copy(key: SubjectKey | None) -> SubjectKey | None:
    return SubjectKey(key.kid, key.secret) if key is not None else None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class FileKeyStore:
    """Keys in a directory: one key file per subject, named by `subject_handle`, mode 0600.

    Layout (the directory is created mode 0700)::

        <handle>.key     b"PFK1" + generation (4 bytes, big endian) + 32 secret bytes
        <handle>.erased  JSON {"erased": [{"kid": "<handle>.<g>", "erased_at": ...}, ...]}: no key material

    A key file is created atomically (written to a private temporary file, then hard-linked into place,
    which fails if another process got there first: both then use the same key). `erase` first writes
    the erased marker, then overwrites the key file in place with random bytes, syncs it and deletes it;
    an erase interrupted half-way is finished by the next call that meets the key. After an erase the
    subject's next run creates generation g+1: the subject can keep using the agent, and the marker
    lets an opener tell "erased" (`ValueErased`, expected) from "never issued" (`UnknownKey`, a fault).

    Overwriting cannot reach copies the file system or the disk keep elsewhere (journals, copy-on-write
    snapshots, SSD remapping) nor backups: keep the key directory out of backups, or on storage whose
    copies are erased with it. Files readable by group or others are refused.

    What it read of a subject's two files (its current key and its erased ids) is kept in memory while both
    files stay as they were: each call compares their identity (``os.stat``: inode, device, mode, size,
    modification and change times; "absent" for a missing file) with the identity they had when read, and
    reads them again on any difference. An erase or a new generation, by this process or another one,
    changes the erased marker (replaced, and longer by one id each time) and the key file, so no key is
    used from memory after it was erased or rotated; this store's own `erase` also drops (and zeroes) the
    kept copy at once. At most `CACHED_SUBJECTS` subjects are kept (the least recently used go first).
    """

    #: How many subjects' keys are kept in memory between calls.
    CACHED_SUBJECTS = 1024

    _MAGIC = b"PFK1"
    _FILE_BYTES = 4 + 4 + _KEY_BYTES

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise KeyStoreError(f"cannot create the key directory {self.directory}: {exc.strerror}") from exc
        if not self.directory.is_dir():
            raise KeyStoreError(f"the key directory {self.directory} is not a directory")
        # Per subject handle: the identity of its two files when read, its erased ids, its current key.
        self._kept: OrderedDict[str, tuple[_Stamp, dict[str, str], SubjectKey | None]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileKeyStore({str(self.directory)!r})"

    # -- the port ----------------------------------------------------------------------------------------

    def key_for(self, subject: str | None) -> SubjectKey:
        handle = subject_handle(subject)
        erased, current = self._state(handle)
        if current is not None and current.kid in erased:
            current.wipe()
            self._shred(handle)  # an erase that was interrupted before the key file was gone
            current = None
        if current is not None:
            return current
        generation = max((parse_kid(kid)[1] for kid in erased), default=0) + 1
        return self._create(handle, generation)

    def key_by_id(self, kid: str) -> SubjectKey:
        handle, _ = parse_kid(kid)
        erased, current = self._state(handle)
        if kid in erased:
            if current is not None:
                current.wipe()
            raise ValueErased(f"key {kid} was erased")
        if current is None or current.kid != kid:
            if current is not None:
                current.wipe()
            raise UnknownKey(f"key {kid} was never issued by {self!r}")
        return current

    def erase(self, subject: str | None) -> list[str]:
        handle = subject_handle(subject)
        self._forget(handle)
        erased = self._erased(handle)
        current = self._read(handle)
        kids: list[str] = []
        if current is not None:
            kids.append(current.kid)
            current.wipe()
        entries = [{"kid": kid, "erased_at": at} for kid, at in erased.items()]
        entries += [{"kid": kid, "erased_at": _now()} for kid in kids if kid not in erased]
        self._write_marker(handle, entries)
        self._shred(handle)
        self._forget(handle)
        return kids

    # -- what was read, kept while the files stay as they were -------------------------------------------

    def _stamp(self, handle: str) -> _Stamp:
        """The identity of the subject's key file and erased marker (None for a file that is absent)."""
        return (_identity(self._path(handle, ".key")), _identity(self._path(handle, ".erased")))

    def _state(self, handle: str) -> tuple[dict[str, str], SubjectKey | None]:
        """The subject's erased ids and a copy of its current key (None: none), read again whenever either
        file's identity differs from when they were last read."""
        stamp = self._stamp(handle)  # taken before reading: a change while reading is seen next time
        with self._lock:
            kept = self._kept.get(handle)
            if kept is not None and kept[0] == stamp:
                self._kept.move_to_end(handle)
                return dict(kept[1]), _copy(kept[2])
        erased = self._erased(handle)
        current = self._read(handle)
        with self._lock:
            self._drop(handle)
            self._kept[handle] = (stamp, erased, _copy(current))
            while len(self._kept) > self.CACHED_SUBJECTS:
                _, (_, _, key) = self._kept.popitem(last=False)
                if key is not None:
                    key.wipe()
        return dict(erased), current

    def _drop(self, handle: str) -> None:
        kept = self._kept.pop(handle, None)
        if kept is not None and kept[2] is not None:
            kept[2].wipe()

    def _forget(self, handle: str) -> None:
        with self._lock:
            self._drop(handle)

    # -- files -------------------------------------------------------------------------------------------

    def _path(self, handle: str, suffix: str) -> Path:
        return self.directory / f"{handle}{suffix}"

    def _read(self, handle: str) -> SubjectKey | None:
        path = self._path(handle, ".key")
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreError(f"cannot read key file {path.name}: {exc.strerror}") from exc
        buffer = bytearray(self._FILE_BYTES)
        try:
            info = os.fstat(fd)
            if info.st_mode & 0o077:
                raise KeyStoreError(f"key file {path.name} is readable by others: chmod 600 it (and 700 its dir)")
            with os.fdopen(fd, "rb", buffering=0, closefd=True) as handle_file:
                fd = -1
                read = handle_file.readinto(buffer)
            if read != self._FILE_BYTES or buffer[:4] != self._MAGIC:
                raise KeyStoreError(f"key file {path.name} is not a preflight key file")
            generation = int.from_bytes(buffer[4:8], "big")
            if generation < 1:
                raise KeyStoreError(f"key file {path.name} has no valid generation")
            return SubjectKey(make_kid(handle, generation), memoryview(buffer)[8:])
        finally:
            if fd >= 0:
                os.close(fd)
            buffer[:] = bytes(len(buffer))

    def _create(self, handle: str, generation: int) -> SubjectKey:
        final = self._path(handle, ".key")
        temporary = self._path(handle, f".{os.urandom(8).hex()}.tmp")
        content = bytearray(self._MAGIC + generation.to_bytes(4, "big") + os.urandom(_KEY_BYTES))
        linked = False
        try:
            write_new_private(temporary, content)
            try:
                os.link(temporary, final)  # fails if another process created the key first: use that one
                linked = True
            except FileExistsError:
                pass
            self._sync_directory()
        except OSError as exc:
            raise KeyStoreError(f"cannot create a key file in {self.directory}: {exc.strerror}") from exc
        finally:
            content[:] = bytes(len(content))
            with contextlib.suppress(OSError):
                if not linked:  # an unused secret of our own: destroy it (a linked one *is* the key file)
                    self._overwrite(temporary)
                temporary.unlink()
        created = self._read(handle)
        if created is None:
            raise KeyStoreError(f"the key file {final.name} vanished right after it was created")
        return created

    def _erased(self, handle: str) -> dict[str, str]:
        path = self._path(handle, ".erased")
        try:
            data = json.loads(path.read_bytes())
            return {str(e["kid"]): str(e["erased_at"]) for e in data["erased"]}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyStoreError(f"erased marker {path.name} is unreadable: {type(exc).__name__}") from exc

    def _write_marker(self, handle: str, entries: list[dict[str, str]]) -> None:
        path = self._path(handle, ".erased")
        temporary = self._path(handle, f".{os.urandom(8).hex()}.tmp")
        try:
            write_new_private(temporary, canonical_json({"erased": entries}))
            os.replace(temporary, path)
            self._sync_directory()
        except OSError as exc:
            raise KeyStoreError(f"cannot write the erased marker {path.name}: {exc.strerror}") from exc

    def _shred(self, handle: str) -> None:
        path = self._path(handle, ".key")
        try:
            self._overwrite(path)
            path.unlink()
            self._sync_directory()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise KeyStoreError(f"cannot destroy key file {path.name}: {exc.strerror}") from exc

    @staticmethod
    def _overwrite(path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            size = os.fstat(fd).st_size
            os.write(fd, os.urandom(size))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _sync_directory(self) -> None:
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def files(self) -> list[str]:
        """The names in the key directory (for checks: no user id appears in them)."""
        return sorted(p.name for p in self.directory.iterdir())
