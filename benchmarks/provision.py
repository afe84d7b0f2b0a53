"""Bytes a device fetches to provision one engine from a published package, against the engine and the package.

    python benchmarks/provision.py [--models resnet mobilenet encoder] [--precisions fp32 fp16]

What is measured, in one run: the real-model corpus (tests/zoo.py) built for rtx-turing/ampere/ada, each package
published to a moto S3 server on 127.0.0.1 that counts the bytes it serves; then for every model and GPU:
  1. `trtflow provision s3://... --gpu sm_XY` as its own process: bytes served (at the server), wall seconds;
  2. the same again (already installed): bytes, requests and seconds of the no-op (a conditional GET of the channel);
  3. the baseline, measured the same way: fetching the package's .tar.gz (what a device had to do before, to then
     provision from the archive).
Printed per provision: engine bytes, fetched bytes, fetched / engine (goal: the manifest only on top), the
archive's bytes / fetched (how much less than the baseline), and seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from fleet import MODELS, PRECISIONS, TARGETS, write_fleet_project  # noqa: E402
from s3server import CountingS3  # noqa: E402
from zoo import ZOO  # noqa: E402

from trtflow.util.archive import write_reproducible_tar  # noqa: E402


def trtflow(env: dict, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    """Run `trtflow ARGS` in `env`: its seconds and the finished process."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtflow", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"trtflow {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - started, done


def main() -> None:
    """Time provisioning from a local package and from a remote, and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet", "mobilenet", "encoder"], choices=ZOO)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"], choices=PRECISIONS)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trtflow-provision-bench-"))
    server = CountingS3()
    try:
        root = write_fleet_project(
            work / "fleet", tuple(m for m in options.models if m in MODELS), tuple(options.precisions)
        )
        print(f"building {len(options.models)} models x {options.precisions} x {len(TARGETS)} targets ...", flush=True)
        trtflow(server.env(), "-C", str(root), "run", "-j", "2")
        bucket, rows = server.bucket(), []
        for package in sorted(p for p in (root / "artifacts" / "packages").iterdir() if p.is_dir()):
            url = f"s3://{bucket}/{package.name}"
            trtflow(server.env(), "publish", str(package), url)
            server.reset()
            archive = work / f"{package.name}.tar.gz"  # the package as one file, as `package: {archive: true}` packs it
            write_reproducible_tar(package, archive, package.name)
            server.client().upload_file(str(archive), bucket, archive.name)
            built_for = {
                cc
                for e in json.loads((package / "manifest.json").read_text())["engines"]
                for cc in e["compute_capabilities"]
            }
            for gpu in (gpu for gpu in TARGETS.values() if gpu in built_for):  # no fp32 GEMM engine builds for sm_75
                dest = work / "devices" / gpu
                server.reset()
                seconds, done = trtflow(server.env(), "provision", url, "--gpu", gpu, "--dest", str(dest), "--json")
                fetched, engine = (
                    sum(server.served.values()),
                    json.loads(done.stdout)["chosen"]["manifest_entry"]["size"],
                )
                server.reset()
                again, _ = trtflow(server.env(), "provision", url, "--gpu", gpu, "--dest", str(dest), "--json")
                noop_bytes, noop_requests = sum(server.served.values()), len(server.requests)
                server.reset()
                started = time.perf_counter()
                server.client().download_file(bucket, f"{package.name}.tar.gz", str(work / "archive.tar.gz"))
                archive_seconds, archive = time.perf_counter() - started, sum(server.served.values())
                rows.append(
                    (
                        package.name,
                        gpu,
                        engine,
                        fetched,
                        noop_bytes,
                        archive,
                        seconds,
                        again,
                        archive_seconds,
                        noop_requests,
                    )
                )
        print(
            f"\n{'model':<12} {'gpu':<6} {'engine':>10} {'fetched':>10} {'fetched/engine':>15} {'archive/fetched':>16} "
            f"{'no-op bytes':>12} {'no-op reqs':>11} {'provision s':>12} {'no-op s':>8}"
        )
        for name, gpu, engine, fetched, noop_bytes, archive, seconds, again, _, noop_requests in rows:
            print(
                f"{name:<12} {gpu:<6} {engine:>10} {fetched:>10} {fetched / engine:>15.4f} {archive / fetched:>16.2f} "
                f"{noop_bytes:>12} {noop_requests:>11} {seconds:>12.2f} {again:>8.2f}"
            )
        print(
            f"\nmedian fetched / engine: {statistics.median(r[3] / r[2] for r in rows):.4f} (1.0 + the channel file "
            "and the manifest); "
            f"median archive / fetched: {statistics.median(r[5] / r[3] for r in rows):.2f}x less than fetching the "
            "package"
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
