"""Issue 46, item 1: a run that cannot write its checkpoints does not end "completed".

Each failed save is reported (``command.failed``), its staging folder removed, and tried again at
the next publish — in the finale at once; after ``run.checkpoint_retries`` failed tries in a row
the run ends with an error naming the folder, the OS error, the last good checkpoint and the
``--resume`` line. The faults are real: a folder made unwritable the way an operator's tester
made it (``chattr +i``, as root; ``chmod`` otherwise) and a real small filesystem (a 1 MiB tmpfs)
filled mid-run — never a mocked ``open``. The coordinator, its checkpoint store and the trainer
host are the real ones, over in-process replicas on the virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shunter.engine.io.checkpoint import CheckpointStore
from shunter.events import CheckpointSaved, CommandFailed, StepEnd
from tests.support.configs import cfg
from tests.support.fakes import local_run, virtual_time


def _config(**run):
    return cfg(
        run={"total_steps": 12, "checkpoint_every": 2, "checkpoint_retries": 2, **run},
        validation={"every": 0},
        rollout={"standalone_replicas": 1, "max_staleness": 1},
    )


class Unwritable:
    """A folder no one may write into, root included: ``chattr +i`` when root (as the outside
    tester did), else ``chmod 0o555``; undone by :meth:`undo`."""

    def __init__(self, path: Path) -> None:
        self.path, self.how = path, ""

    def __call__(self) -> None:
        if os.geteuid() == 0:
            out = subprocess.run(["chattr", "+i", str(self.path)], capture_output=True, text=True)
            if out.returncode != 0:
                pytest.skip(f"chattr +i is not possible here ({out.stderr.strip()}): root ignores chmod")
            self.how = "chattr"
        else:
            self.path.chmod(0o555)
            self.how = "chmod"
        with pytest.raises(OSError):  # it is really unwritable
            (self.path / "probe").write_bytes(b"")

    def undo(self) -> None:
        if self.how == "chattr":
            subprocess.run(["chattr", "-i", str(self.path)], check=True)
        elif self.how == "chmod":
            self.path.chmod(0o755)
        self.how = ""


@pytest.fixture
def unwritable(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    u = Unwritable(folder)
    yield u
    u.undo()


def _at(pred, action):
    """A sink that does ``action`` once, right when the coordinator records a message ``pred`` holds for."""
    done = []

    def sink(m):
        if not done and pred(m):
            done.append(m)
            action()

    return sink


async def _run(coord):
    seen: list = []
    coord.sinks.append(seen.append)
    try:
        async with asyncio.timeout(60):
            ended = await coord.run()
    finally:
        await coord.executor.close()
    return ended, seen


@virtual_time
async def test_a_folder_made_unwritable_mid_run_ends_it_with_the_last_good_checkpoint(unwritable):
    c = _config()
    coord, _, _ = local_run(c, checkpoints=unwritable.path)
    coord.sinks.insert(0, _at(lambda m: isinstance(m, CheckpointSaved) and m.step == 4, unwritable))
    ended, seen = await _run(coord)

    assert ended.reason == "error", ended
    saved = [m.step for m in seen if isinstance(m, CheckpointSaved)]
    assert saved == [2, 4]
    failed = [m for m in seen if isinstance(m, CommandFailed) and m.command_kind.startswith("checkpoint")]
    assert len(failed) == c.run.checkpoint_retries + 1  # tried at three publishes, then the run ended
    assert ended.steps < c.run.total_steps  # it did not train on without checkpoints to the end
    err = ended.error
    assert f"could not be saved in {unwritable.path}" in err
    assert "3 tries in a row; run.checkpoint_retries = 2" in err
    assert ("PermissionError" in err) or ("Operation not permitted" in err), err
    assert f"the last good checkpoint is step 4 ({unwritable.path / 'step-00000004'})" in err
    assert f"--resume {unwritable.path.parent}" in err


@virtual_time
async def test_a_failed_final_save_is_tried_again_then_fails_the_run(unwritable):
    """Only the final checkpoint is due (checkpoint_every past the run's end); the folder is
    unwritable from the start: the finale tries it 1 + retries times, then the run fails, saying
    nothing was saved."""
    c = _config(total_steps=4, checkpoint_every=100)
    unwritable()
    coord, _, _ = local_run(c, checkpoints=unwritable.path)
    ended, seen = await _run(coord)

    assert ended.reason == "error", ended
    assert ended.steps == 4
    failed = [m for m in seen if isinstance(m, CommandFailed) and m.command_kind.startswith("checkpoint")]
    assert len(failed) == 3
    assert "checkpoint at step 4 could not be saved" in ended.error
    assert "no checkpoint of this run was saved, so there is nothing to resume from" in ended.error


@virtual_time
async def test_a_save_that_fails_once_is_tried_again_and_the_run_completes(unwritable):
    """A passing fault (the folder writable again before the next publish): one ``command.failed``,
    the next cut commits, the failures in a row start again from zero, the run completes."""
    c = _config()
    coord, _, _ = local_run(c, checkpoints=unwritable.path)
    coord.sinks.insert(0, _at(lambda m: isinstance(m, CheckpointSaved) and m.step == 4, unwritable))
    coord.sinks.insert(
        1, _at(lambda m: isinstance(m, CommandFailed) and m.command_kind.startswith("checkpoint"), unwritable.undo)
    )
    ended, seen = await _run(coord)

    assert ended.reason == "completed", ended
    failed = [m for m in seen if isinstance(m, CommandFailed) and m.command_kind.startswith("checkpoint")]
    assert len(failed) == 1
    saved = [m.step for m in seen if isinstance(m, CheckpointSaved)]
    assert saved[:2] == [2, 4] and saved[-1] == 12 and len(saved) >= 5
    assert coord.cuts.failures == 0
    assert not list(unwritable.path.glob(".step-*.tmp"))  # the failed try's staging folder is gone


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "1m"):
    """A real size-limited filesystem (tmpfs) mounted at ``path``: needs root (CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({out.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path) -> None:
    """Fill the filesystem of ``folder`` to the last byte (a disk that fills mid-run)."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    with contextlib.suppress(OSError), open(folder / "filler2", "wb") as f:  # the last partial block
        while True:
            f.write(b"\0" * 512)
            f.flush()


@virtual_time
async def test_a_disk_that_fills_mid_run_ends_it_naming_enospc_and_frees_its_staging(tmp_path):
    with small_filesystem(tmp_path / "disk") as disk:
        c = _config()
        coord, _, _ = local_run(c, checkpoints=disk)
        coord.sinks.insert(0, _at(lambda m: isinstance(m, StepEnd) and m.step == 5, lambda: _fill(disk)))
        ended, seen = await _run(coord)

        assert ended.reason == "error", ended
        assert [m.step for m in seen if isinstance(m, CheckpointSaved)] == [2, 4]
        assert "No space left on device" in ended.error, ended.error
        assert "its disk has 0.0 MB free, a checkpoint takes" in ended.error and "the disk is full" in ended.error
        assert f"the last good checkpoint is step 4 ({disk / 'step-00000004'})" in ended.error
        assert not list(disk.glob(".step-*.tmp"))  # each failed try gave its space back
        # the checkpoint it names is whole: a resume could use it
        found = CheckpointStore(disk).latest()
        assert found is not None and found.manifest.step == 4
        shutil.rmtree(disk / "step-00000004")
