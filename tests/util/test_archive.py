"""Packages are byte-reproducible and extraction never escapes its destination."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from trtflow.util.archive import UnsafeArchive, extract_tar, write_reproducible_tar


def _folder(root: Path) -> Path:
    (root / "engines" / "a").mkdir(parents=True)
    (root / "engines" / "a" / "m.engine").write_bytes(b"\x00\x01engine")
    (root / "manifest.json").write_text("{}")
    return root


def test_same_files_give_same_bytes_whatever_the_mtimes(tmp_path: Path) -> None:
    first, second = _folder(tmp_path / "one"), _folder(tmp_path / "two")
    os.utime(second / "manifest.json", (1, 1))
    write_reproducible_tar(first, tmp_path / "1.tar.gz", "pkg")
    write_reproducible_tar(second, tmp_path / "2.tar.gz", "pkg")
    assert (tmp_path / "1.tar.gz").read_bytes() == (tmp_path / "2.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "1.tar.gz") as tar:
        assert tar.getnames() == ["pkg/engines/a/m.engine", "pkg/manifest.json"]
        assert {(m.mtime, m.uid, m.mode) for m in tar.getmembers()} == {(0, 0, 0o644)}


def test_extract_round_trips(tmp_path: Path) -> None:
    write_reproducible_tar(_folder(tmp_path / "src"), tmp_path / "p.tar.gz", "pkg")
    extract_tar(tmp_path / "p.tar.gz", tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "engines" / "a" / "m.engine").read_bytes() == b"\x00\x01engine"


@pytest.mark.parametrize(
    "names",
    [
        ["../escape.txt"],
        ["/abs/escape.txt"],
        ["pkg/../../escape.txt"],
        ["pkg/ok.txt", "pkg/../../escape.txt"],  # members are extracted as they stream past: a late one still raises
    ],
)
def test_extract_refuses_members_outside_the_destination(tmp_path: Path, names: list[str]) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(UnsafeArchive):
        extract_tar(archive, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


def test_extract_refuses_links(tmp_path: Path) -> None:
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("pkg/link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(UnsafeArchive):
        extract_tar(archive, tmp_path / "dest")
