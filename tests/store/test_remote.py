"""The remote cache against a real S3-compatible server (moto, on 127.0.0.1) and a file:// directory.

Runs are real `trtflow run` processes with the S3 endpoint and credentials in their environment, as in
CI; nothing about the remote is faked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import (
    PIPELINE,
    TINY_RECIPE,
    package_files,
    read_remote_record,
    trtflow,
    write_project,
    write_remote_record,
)

pytest.importorskip("s3fs", reason="the S3 remote needs s3fs: pip install s3fs")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install 'moto[server]'")

SECRET = f"secret-{uuid.uuid4().hex}"  # must never reach a record, the index or the lock
RECIPE = TINY_RECIPE.replace("targets: [rtx-ampere, rtx-ada]", "targets: [rtx-ada]")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint() -> str:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "moto server did not start"
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def s3_client(endpoint: str):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key=SECRET, region_name="us-east-1"
    )


def bucket(endpoint: str) -> str:
    name = f"cache-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def aws_env(endpoint: str) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def clone(root: Path, remote: str) -> Path:
    """A project with one recipe and one target (5 stages, 1 engine) whose pipeline.yaml names `remote`."""
    return write_project(root, {"tiny": RECIPE}, pipeline=PIPELINE + f"cache:\n  remote: {remote}\n")


def run(root: Path, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    """`trtflow run --json` as a separate process with `env` (the S3 endpoint and credentials, as in CI)."""
    result = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def statuses(summary: dict) -> dict[str, tuple[str, str]]:
    return {node["id"]: (node["status"], node["reason"]) for node in summary["nodes"]}


def built(summary: dict) -> set[str]:
    return {node_id for node_id, (status, _) in statuses(summary).items() if status == "built"}


@pytest.fixture(scope="module")
def published(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A bucket whose `trtflow/` prefix a first clone filled by building everything; (bucket, that clone)."""
    name = bucket(s3_endpoint)
    first = clone(tmp_path_factory.mktemp("first") / "proj", f"s3://{name}/trtflow")
    code, summary, err = run(first, aws_env(s3_endpoint))
    assert code == 0 and summary["built"] == 5 and summary["warnings"] == [], err
    return name, first


def test_a_second_clone_sharing_only_the_remote_builds_nothing(
    s3_endpoint: str, published: tuple[str, Path], tmp_path: Path
) -> None:
    name, first = published
    second = clone(tmp_path / "second", f"s3://{name}/trtflow")
    code, summary, err = run(second, aws_env(s3_endpoint))
    assert code == 0 and summary["built"] == 0 and summary["warnings"] == [], err
    assert set(statuses(summary).values()) == {("cached", "pulled from the remote cache")}
    assert package_files(second) == package_files(first)
    assert trtflow(second, "cache", "verify").code == 0
    for root in (first, second):
        store = root / "artifacts" / "store"
        for path in [root / "trtflow.lock", *(p for p in store.rglob("*") if p.is_file() and "objects" not in p.parts)]:
            assert SECRET.encode() not in path.read_bytes()


def test_a_tampered_remote_object_is_rejected_rebuilt_and_repaired(
    s3_endpoint: str, published: tuple[str, Path], tmp_path: Path
) -> None:
    name, first = published
    client = s3_client(s3_endpoint)
    for item in client.list_objects_v2(Bucket=name, Prefix="trtflow/")["Contents"]:  # a copy of its own to tamper with
        client.copy_object(
            Bucket=name,
            Key="tampered/" + item["Key"].removeprefix("trtflow/"),
            CopySource={"Bucket": name, "Key": item["Key"]},
        )
    digest = json.loads((first / "artifacts/packages/tiny/manifest.json").read_text())["engines"][0]["sha256"]
    key = f"tampered/objects/{digest[:2]}/{digest}"
    good = client.get_object(Bucket=name, Key=key)["Body"].read()
    client.put_object(Bucket=name, Key=key, Body=good[:100] + bytes([good[100] ^ 1]) + good[101:])

    second = clone(tmp_path / "second", f"s3://{name}/tampered")
    code, summary, err = run(second, aws_env(s3_endpoint))
    assert code == 0, err
    assert built(summary) == {"build:tiny/fp32/rtx-ada"}
    assert any("rejected the record of build:tiny/fp32/rtx-ada" in w and digest in w for w in summary["warnings"])
    assert package_files(second) == package_files(first)
    assert hashlib.sha256(client.get_object(Bucket=name, Key=key)["Body"].read()).hexdigest() == digest  # pushed again
    assert trtflow(second, "cache", "verify").code == 0


def test_an_unreachable_remote_warns_once_and_builds_locally_unless_required(
    published: tuple[str, Path], tmp_path: Path
) -> None:
    _, first = published
    root = Path(shutil.copytree(first, tmp_path / "p", symlinks=True))
    package = json.loads((root / "trtflow.lock").read_text())["nodes"]["package:tiny"]["outputs"]["manifest.json"]
    (root / "artifacts/store/objects" / package[:2] / package).unlink()  # the one stage left to run
    env = aws_env(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    code, summary, err = run(root, env, "--remote-required")
    assert code == 4 and summary["exit_code"] == 4 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: remote cache s3://") and "--remote-required" in err
    assert summary["error"].startswith("remote cache s3://")  # what stderr says, for a script reading --json
    code, summary, err = run(root, env)
    assert code == 0 and built(summary) == {"package:tiny"}, err
    assert len(summary["warnings"]) == 1 and "unavailable (reading the record of package:tiny" in summary["warnings"][0]
    assert err.count("warning:") == 1
    assert package_files(root) == package_files(first)


def test_a_file_remote_shares_builds_and_rejects_a_forged_record(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    first, second = clone(tmp_path / "first", shared.as_uri()), clone(tmp_path / "second", shared.as_uri())
    assert trtflow(first, "run").code == 0
    lock = json.loads((first / "trtflow.lock").read_text())["nodes"]
    forged = shared / "records" / f"{lock['package:tiny']['key']}.json"
    record = read_remote_record(forged)
    record["components"]["params"]["recipe"] = "forged"  # no longer hashes to its key
    write_remote_record(forged, record)
    result = trtflow(second, "run", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert built(summary) == {"package:tiny"}
    assert any(
        "rejected the record of package:tiny: its key components do not hash to its key" in w
        for w in summary["warnings"]
    )
    assert package_files(second) == package_files(first)


def test_an_unusable_file_remote_is_a_remote_failure(tmp_path: Path) -> None:
    """A local error inside the remote (its folder is a file) is the remote's trouble, not the store's."""
    not_a_folder = tmp_path / "remote-is-a-file"
    not_a_folder.write_text("")
    root = clone(tmp_path / "p", not_a_folder.as_uri())
    result = trtflow(root, "run", "--remote-required")
    assert result.code == 4 and "unavailable (reading the record of cleanup:tiny: NotADirectoryError" in result.err
    assert not (root / "artifacts" / "packages").exists()


def test_credentials_in_pipeline_yaml_are_refused(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "p",
        pipeline=PIPELINE + "cache:\n  remote: s3://b/p\n  options: {client_kwargs: {aws_secret_access_key: x}}\n",
    )
    result = trtflow(root, "validate")
    assert result.code == 3
    assert (
        "credentials do not belong in pipeline.yaml" in result.err
        and "options.client_kwargs.aws_secret_access_key" in result.err
    )
