"""``CheckpointStore``: checkpoints that are either complete or invisible.

Invariant: a checkpoint folder appears under its final name (``step-00000010``) only when
it is complete. Its parts are written into a staging folder (``.step-00000010.tmp``) and
fsynced; ``MANIFEST.json`` — every file with its size and SHA-256 — is written last; then
the folder is renamed into place and the ``latest`` pointer is replaced atomically. A crash
at any moment leaves the previous checkpoint usable, and :meth:`latest` returns the newest
folder (by step number) whose files match its manifest. Nothing is passed over silently: a
torn or tampered folder, a ``latest`` pointer that is unreadable or names an older or missing
checkpoint, and stray folders that only look like checkpoints are each named, with the reason,
in ``Found.skipped`` — the resumed run reports them (``RunResumed.skipped``). The ``latest``
pointer is for people and tools; the resolver trusts the manifests, never the pointer.

Layout::

    checkpoints/
      latest                      "step-00000010"
      step-00000010/
        model/                    HF model dir (the trainer's weights = published version)
        trainer.pt                optimizer state, step, version, RNG
        coordinator.msgpack       CoordinatorSnapshot (buffer, prompts in flight, policy)
        MANIFEST.json
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import msgspec

MANIFEST = "MANIFEST.json"
LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the folder and the cause."""


class FileEntry(msgspec.Struct, frozen=True):
    size: int
    sha256: str


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    step: int
    version: int
    created: float
    files: dict[str, FileEntry]

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files.values())


class Found(NamedTuple):
    """A checkpoint chosen to resume from, and what was passed over on the way (name -> why)."""

    path: Path
    manifest: Manifest
    skipped: dict[str, str] = {}


_FINAL = re.compile(r"step-(\d+)")
_STAGING = re.compile(r"\.step-(\d+)\.tmp")


def _name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: Path) -> FileEntry:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return FileEntry(size=size, sha256=h.hexdigest())


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointStore:
    def __init__(self, root: str | Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    # -- writing ---------------------------------------------------------------------
    def staging(self, step: int) -> Path:
        """An empty staging folder for the checkpoint of ``step`` (a leftover from a crash is cleared)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.staging_path(step)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path

    def staging_path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before it is committed."""
        return self.root / f".{_name(step)}.tmp"

    def discard(self, staging: str | Path) -> None:
        """Remove a staging folder whose checkpoint failed (on a full disk it holds the space
        the next try needs); a folder that cannot be removed is left for :meth:`prune`."""
        shutil.rmtree(staging, ignore_errors=True)

    def commit(self, staging: Path, *, run_id: str, step: int, version: int) -> tuple[Path, Manifest]:
        """Seal a fully written staging folder: fsync its files, write the manifest, rename
        it into place, point ``latest`` at it, prune old ones. Returns (folder, manifest)."""
        staging = Path(staging)
        if not staging.is_dir():
            raise CheckpointError(f"staging folder {staging} does not exist")
        files = {}
        for p in sorted(staging.rglob("*")):
            if p.is_file() and p.name != MANIFEST:
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
                files[str(p.relative_to(staging))] = _digest(p)
        for d in sorted({p.parent for p in staging.rglob("*")} | {staging}, key=lambda x: -len(x.parts)):
            _fsync_dir(d)
        manifest = Manifest(run_id=run_id, step=step, version=version, created=time.time(), files=files)
        write_atomic(staging / MANIFEST, msgspec.json.encode(manifest))
        final = self.root / _name(step)
        if final.exists():  # a redo of the same step (after a resume): replace it whole
            trash = self.root / f".{final.name}.old"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(staging, final)
        _fsync_dir(self.root)
        write_atomic(self.root / LATEST, final.name.encode())
        self.prune()
        return final, manifest

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; remove older ones and stale staging
        folders of steps already committed."""
        done = self.complete()
        for p in done[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)
        newest = _step_of(done[-1]) if done else -1
        for p in self.root.glob(".step-*.tmp"):
            m = _STAGING.fullmatch(p.name)
            if m is not None and int(m[1]) <= newest:
                shutil.rmtree(p, ignore_errors=True)

    # -- reading ---------------------------------------------------------------------
    def complete(self) -> list[Path]:
        """Folders named ``step-<number>`` holding a manifest, oldest first (not yet verified)."""
        if not self.root.is_dir():
            return []
        found = [
            p for p in self.root.glob("step-*") if _FINAL.fullmatch(p.name) and p.is_dir() and (p / MANIFEST).is_file()
        ]
        return sorted(found, key=_step_of)

    def verify(self, path: str | Path) -> Manifest:
        """The manifest of a checkpoint whose files all match it; else CheckpointError naming the file."""
        path = Path(path)
        try:
            manifest = msgspec.json.decode((path / MANIFEST).read_bytes(), type=Manifest)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no {MANIFEST} (an unfinished checkpoint)") from None
        except msgspec.MsgspecError as e:
            raise CheckpointError(f"{path}/{MANIFEST} is unreadable: {e}") from None
        for rel, want in manifest.files.items():
            f = path / rel
            if not f.is_file():
                raise CheckpointError(f"{path}: {rel} is missing")
            got = _digest(f)
            if got != want:
                raise CheckpointError(
                    f"{path}: {rel} does not match the manifest "
                    f"({got.size} bytes, sha256 {got.sha256[:12]}… expected {want.size} bytes, "
                    f"{want.sha256[:12]}…)"
                )
        return manifest

    def latest(self) -> Found | None:
        """The newest checkpoint (by step) that verifies, with what was passed over; or None."""
        return self.scan()[0]

    def scan(self) -> tuple[Found | None, dict[str, str]]:
        """(the newest checkpoint that verifies or None, everything passed over: name -> why)."""
        skipped = self._strays()
        for p in reversed(self.complete()):
            try:
                manifest = self.verify(p)
            except CheckpointError as e:
                skipped[p.name] = str(e)
                continue
            if (why := self._pointer_disagrees(p)) is not None:
                skipped[LATEST] = why
            return Found(p, manifest, skipped), skipped
        return None, skipped

    def _strays(self) -> dict[str, str]:
        """Entries that look like checkpoints but cannot be one (never deleted: a person decides)."""
        out: dict[str, str] = {}
        if not self.root.is_dir():
            return out
        for p in self.root.glob("step-*"):
            if not _FINAL.fullmatch(p.name):
                out[p.name] = f"{self.root / p.name}: not a checkpoint name (step-<number>); left as it is"
            elif not p.is_dir():
                out[p.name] = f"{self.root / p.name}: not a folder"
            elif not (p / MANIFEST).is_file():
                out[p.name] = f"{p}: no {MANIFEST} (an unfinished or damaged checkpoint)"
        return out

    def _pointer_disagrees(self, chosen: Path) -> str | None:
        pointer = self.root / LATEST
        if not pointer.exists():
            return None
        try:
            named = pointer.read_bytes().decode("ascii").strip()
        except (OSError, UnicodeDecodeError) as e:
            return f"{pointer} is unreadable ({type(e).__name__}); chose {chosen.name}, the newest that verifies"
        if named == chosen.name:
            return None
        return f"{pointer} names {named!r}; chose {chosen.name}, the newest that verifies"


def _step_of(p: Path) -> int:
    m = _FINAL.fullmatch(p.name)
    if m is None:
        raise ValueError(f"{p.name!r} is not a checkpoint name")
    return int(m[1])


def resolve(path: str | Path) -> Found:
    """A checkpoint folder from what a user names: the folder itself, a ``checkpoints``
    folder, or a run folder holding one. Raises CheckpointError naming what was looked at."""
    p = Path(path)
    if not p.exists():
        near = sorted(q.name for q in p.parent.iterdir() if q.is_dir())[:8] if p.parent.is_dir() else []
        hint = f" ({p.parent} holds: {', '.join(near)})" if near else ""
        raise CheckpointError(f"{p} does not exist{hint}")
    if (p / MANIFEST).is_file():
        return Found(p, CheckpointStore(p.parent).verify(p), {})
    for root in (p, p / "checkpoints"):
        if root.is_dir():
            found, skipped = CheckpointStore(root).scan()
            if found is not None:
                return found
            if skipped:
                raise CheckpointError(f"no usable checkpoint under {root}: " + "; ".join(skipped.values()))
    raise CheckpointError(f"no checkpoint found at {p} (looked for {MANIFEST} there, and under {p}/checkpoints)")
