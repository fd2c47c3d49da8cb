"""atomic_write: parents created, the target replaced whole or not at all, no temporary file left behind."""
from __future__ import annotations

import errno
import os

import pytest

import asrkit.atomic
from asrkit.atomic import atomic_write
from tests.full_disk import FullDisk


def test_creates_the_parent_directories_and_leaves_only_the_target(tmp_path):
    target = tmp_path / "a" / "b" / "out.txt"
    with atomic_write(target) as fh:
        fh.write("h\u00e9llo\n")
    assert target.read_bytes() == "h\u00e9llo\n".encode("utf-8")
    assert os.listdir(target.parent) == ["out.txt"]
    with atomic_write(target, "wb") as fh:
        fh.write(b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01" and os.listdir(target.parent) == ["out.txt"]


def test_an_error_in_the_block_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(KeyError):
        with atomic_write(target) as fh:
            fh.write("half of the new")
            raise KeyError("boom")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["out.txt"]




def test_a_full_disk_names_the_target_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(asrkit.atomic, "open", lambda *a, **k: FullDisk(open(*a, **k)), raising=False)
    target = tmp_path / "text"
    with pytest.raises(OSError) as info:
        with atomic_write(target) as fh:
            fh.write("utt1 HELLO\n")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert os.listdir(tmp_path) == []


def test_a_directory_that_cannot_be_written_names_the_target_not_the_temporary_file(tmp_path, monkeypatch):
    def refused(path, *a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(asrkit.atomic, "open", refused, raising=False)
    with pytest.raises(PermissionError) as info:
        with atomic_write(tmp_path / "out.txt") as fh:
            fh.write("x")
    assert info.value.filename == str(tmp_path / "out.txt")


def test_only_write_modes():
    with pytest.raises(ValueError, match="mode"):
        with atomic_write("x", "a"):
            pass
