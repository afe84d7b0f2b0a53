"""Disk: the bytes a project's artifacts take against the unique bytes they hold.

    python benchmarks/disk.py [--models resnet18 mobilenet_v3_small encoder] [--precisions fp32 fp16] [--archive]
                              [--workdir DIR]

What is measured, in one run: the torchvision-size project of benchmarks/torchvision_like.py (ResNet-18,
MobileNetV3-small, a 4-layer encoder; batch 1/8/32; sm_86 and sm_89) at the given precisions, a cold
`trtflow run -j 2` (with `--archive`, every recipe also asks for its `.tar.gz`: `package: {archive: true}`), then
its artifacts folder (the store and the packages) walked:
  - on disk: every regular file's bytes, each inode once (what the disk holds);
  - as copies: every path's bytes, hard links counted again (what the same files take where they cannot be linked:
    another filesystem, or trtflow before its packages linked their engines and archives);
  - unique: the bytes of every distinct content once, less the contents an archive holds that are also files of
    their own (an archive's engines are bytes the project already holds);
  - engines: each engine's bytes once.
Printed: each against unique (goal: on disk <= 1.3x), and the engines' share of it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchvision_like import MODELS, TRIO, write_project  # noqa: E402

from trtflow.hashing import sha256_file  # noqa: E402

GOAL = 1.3


def _archive_members(path: Path) -> set[str]:
    """The digests of the regular files inside a .tar.gz (nothing if it is not one)."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            return {
                hashlib.sha256(archive.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
                for member in archive
                if member.isfile()
            }
    except (tarfile.TarError, OSError):
        return set()


def measure(folder: Path) -> dict[str, int]:
    """On disk, as copies, unique and engine bytes of every regular file under `folder`."""
    inodes: set[tuple[int, int]] = set()
    sizes: dict[str, int] = {}
    inside_archives: set[str] = set()
    engines: set[str] = set()
    disk = copies = 0
    for top, _, names in os.walk(folder):
        for name in names:
            path = Path(top, name)
            seen = path.lstat()
            if path.is_symlink() or not path.is_file():
                continue
            copies += seen.st_size
            if (seen.st_dev, seen.st_ino) in inodes:
                continue
            inodes.add((seen.st_dev, seen.st_ino))
            disk += seen.st_size
            digest = sha256_file(path)
            sizes.setdefault(digest, seen.st_size)
            if name.endswith(".engine"):
                engines.add(digest)
            with open(path, "rb") as handle:
                gzipped = handle.read(2) == b"\x1f\x8b"
            if gzipped:
                inside_archives |= _archive_members(path)
    archived_elsewhere = sum(size for digest, size in sizes.items() if digest in inside_archives)
    return {
        "disk": disk,
        "copies": copies,
        "unique": sum(sizes.values()) - archived_elsewhere,
        "engines": sum(sizes[digest] for digest in engines),
    }


def main() -> int:
    """Build the project cold, walk its artifacts, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(TRIO), choices=list(MODELS))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--archive", action="store_true", help="every recipe also makes its .tar.gz")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-disk-"))
    root = write_project(work / "p", work / "cache", tuple(args.models), tuple(args.precisions))
    for recipe in (root / "recipes").glob("*.yaml") if args.archive else []:
        recipe.write_text(recipe.read_text() + "package: {archive: true}\n")
    done = subprocess.run([sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2"], capture_output=True)
    if done.returncode != 0:
        print(done.stderr.decode(errors="replace")[-2000:])
        return 2
    sizes = measure(root / "artifacts")
    unique = sizes["unique"]
    made = "with archives" if args.archive else "folders only"
    print(f"artifacts of {len(args.models)} models x {len(args.precisions)} precisions x 2 targets, {made} ({root}):")
    for what in ("disk", "copies", "engines"):
        print(f"  {what:<8} {sizes[what] / 1e6:10.1f} MB  {sizes[what] / unique:5.2f}x unique")
    print(f"  {'unique':<8} {unique / 1e6:10.1f} MB")
    ratio = sizes["disk"] / unique
    print(f"goal: on disk <= {GOAL}x unique: {'met' if ratio <= GOAL else 'missed'} ({ratio:.2f}x; as copies "
          f"{sizes['copies'] / unique:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
