"""``CheckpointStore``: checkpoints that are either complete or invisible.

Invariant: a checkpoint folder appears under its final name (``step-00000010``) only when
it is complete. Its parts are written into a staging folder (``.step-00000010.tmp``) and
fsynced; ``MANIFEST.json`` — every file with its size and SHA-256 — is written last; then
the folder is renamed into place and the ``latest`` pointer is replaced atomically. A crash
at any moment leaves the previous checkpoint usable, and :meth:`latest` returns the newest
folder whose files match its manifest (a torn or tampered one is skipped, with the reason
kept in :attr:`skipped`).

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
import shutil
import time
from pathlib import Path

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
        self.skipped: dict[str, str] = {}  # folder -> why latest() passed over it

    # -- writing ---------------------------------------------------------------------
    def staging(self, step: int) -> Path:
        """An empty staging folder for the checkpoint of ``step`` (a leftover from a crash is cleared)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".{_name(step)}.tmp"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path

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
        newest = self._step(done[-1]) if done else -1
        for p in self.root.glob(".step-*.tmp"):
            if self._step(p) <= newest:
                shutil.rmtree(p, ignore_errors=True)

    # -- reading ---------------------------------------------------------------------
    @staticmethod
    def _step(p: Path) -> int:
        return int(p.name.strip(".").split("-")[1].split(".")[0])

    def complete(self) -> list[Path]:
        """Folders with a final name and a manifest, oldest first (not yet verified)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file()]
        return sorted(found, key=self._step)

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

    def latest(self) -> tuple[Path, Manifest] | None:
        """The newest checkpoint that verifies (the ``latest`` pointer first), or None."""
        self.skipped = {}
        order = list(reversed(self.complete()))
        pointer = self.root / LATEST
        if pointer.is_file():
            named = self.root / pointer.read_text().strip()
            order = [named] + [p for p in order if p != named]
        for p in order:
            try:
                return p, self.verify(p)
            except CheckpointError as e:
                self.skipped[p.name] = str(e)
        return None


def resolve(path: str | Path) -> tuple[Path, Manifest]:
    """A checkpoint folder from what a user names: the folder itself, a ``checkpoints``
    folder, or a run folder holding one. Raises CheckpointError naming what was looked at."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        return p, CheckpointStore(p.parent).verify(p)
    for root in (p, p / "checkpoints"):
        if root.is_dir():
            store = CheckpointStore(root)
            found = store.latest()
            if found is not None:
                return found
            if store.skipped:
                raise CheckpointError(f"no usable checkpoint under {root}: " + "; ".join(store.skipped.values()))
    raise CheckpointError(f"no checkpoint found at {p} (looked for {MANIFEST} there, and under {p}/checkpoints)")
