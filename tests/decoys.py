"""A decoy folder outside a project that a hostile input must leave unchanged and unread, and a way to compare it."""

from __future__ import annotations

from pathlib import Path

DECOY_NAME = "decoy"


DECOY_BYTES = b"DECOY-SECRET-" * 100  # never to be found in a package


DECOY_TREE = {
    "engine.bin": DECOY_BYTES,
    "notes.txt": b"must survive",
    "nested/deeper/file.txt": b"must survive too",
    ".hidden": b"hidden",
}


def make_decoy(folder: Path) -> Path:
    """A folder outside the project holding DECOY_TREE (a file whose sha256 a hostile record names, nested folders)."""
    for relative, data in DECOY_TREE.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` by relative path, with its bytes (links are not followed)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }
