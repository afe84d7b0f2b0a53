"""Fleet rollout (issue 29): the content-addressed remote under a racing republish, channels and shares, the agent
through canary -> promote -> rollback on simulated devices, fleet status, remote gc, the preflight.

Packages are the tiny project's real TensorRT-RTX engines (sm_86 rtx-ampere, sm_89 rtx-ada); a second version is
the same package with every engine's bytes changed and its manifest updated (never loaded: no GPU here). The S3
server is moto on 127.0.0.1 counting requests and bytes; agents and provisions run as their own processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_deploy import PACKAGE, cli, manifest_of

from trtflow.deploy.agent import Schedule, next_delay, run
from trtflow.deploy.channels import (
    BadChannel,
    BadRollout,
    Channel,
    parse_channel,
    parse_share,
    pick_version,
    takes_newest,
)

# pure logic -----------------------------------------------------------------------------------------------------


def test_share_is_percent_in_basis_points_and_bad_shares_are_refused() -> None:
    assert [parse_share(s) for s in ("10%", "10", "0.5%", "100%", "0.01%")] == [1000, 1000, 50, 10000, 1]
    for bad in ("0%", "101%", "-5", "ten", "0.001%", "1e9", "nan"):
        with pytest.raises(BadRollout):
            parse_share(bad)


def test_devices_choose_by_a_hash_of_their_id_the_same_way_every_time() -> None:
    ids = [f"dev-{i}" for i in range(2000)]
    ten = {d for d in ids if takes_newest(d, "stable", "a" * 64, 1000)}
    assert ten == {d for d in ids if takes_newest(d, "stable", "a" * 64, 1000)}  # deterministic
    assert 150 <= len(ten) <= 250  # about 10%
    # a larger share keeps the first canaries
    assert ten <= {d for d in ids if takes_newest(d, "stable", "a" * 64, 5000)}
    assert ten != {d for d in ids if takes_newest(d, "stable", "b" * 64, 1000)}  # each release picks its own canaries
    channel = Channel("stable", ("a" * 64, "b" * 64), 1000)
    assert {d: pick_version(channel, d) for d in ids} == {d: "a" * 64 if d in ten else "b" * 64 for d in ids}
    assert pick_version(Channel("stable", ("a" * 64,), 1000), "x") == "a" * 64  # nothing to stay on: everyone takes it


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"channel": "stable", "history": ["../.."], "share_bp": 10000}, "sha256 digests"),
        ({"channel": "stable", "history": ["a" * 64], "share_bp": 10**30}, "share_bp"),
        ({"channel": "stable", "history": ["a" * 64], "share_bp": True}, "share_bp"),
        ({"channel": "other", "history": ["a" * 64], "share_bp": 1}, "not the channel file"),
        ({"channel": "stable", "history": ["a" * 64] * 21, "share_bp": 1}, "1 to 20"),
    ],
)
def test_a_malformed_channel_is_refused(body: dict, fragment: str) -> None:
    with pytest.raises(BadChannel, match=fragment):
        parse_channel(json.dumps(body).encode(), "remote/channels/stable.json", "stable")


def test_backoff_doubles_with_equal_jitter_up_to_the_cap_and_success_waits_the_interval() -> None:
    schedule, rng = Schedule(interval=300, base=10, cap=900), random.Random(29)
    delays = [next_delay(n, schedule, rng) for n in range(1, 10)]
    assert all(
        min(900, 10 * 2 ** (n - 1)) / 2 <= d <= min(900, 10 * 2 ** (n - 1))
        for n, d in zip(range(1, 10), delays, strict=True)
    )
    assert delays == [next_delay(n, schedule, random.Random(29)) for n in [1]] + delays[1:]  # seeded: reproducible
    assert all(270 <= next_delay(0, schedule, rng) <= 330 for _ in range(100))
    slept: list[float] = []
    clock = iter(range(0, 10_000, 1))
    statuses = itertools.cycle([{"consecutive_failures": 1}, {"consecutive_failures": 2}, {"consecutive_failures": 0}])
    run(
        lambda: (next(statuses), None),
        Schedule(interval=30, base=10, cap=900),
        60,
        random.Random(1),
        slept.append,
        lambda: next(clock),
    )
    assert 5 <= slept[0] <= 10 and 10 <= slept[1] <= 20 and 27 <= slept[2] <= 33


# packages -------------------------------------------------------------------------------------------------------


def variant(package: Path, dest: Path, salt: bytes) -> Path:
    """A copy of the package whose engines end in `salt` (another version of every engine), manifest updated."""
    folder = Path(shutil.copytree(package, dest))
    manifest = manifest_of(folder)
    for engine in manifest["engines"]:
        path = folder / engine["file"]
        path.chmod(0o644)
        data = path.read_bytes() + salt
        path.write_bytes(data)
        engine.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder


@pytest.fixture(scope="module")
def versions(built: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("versions")
    return variant(built / PACKAGE, folder / "v1" / "tiny", b""), variant(
        built / PACKAGE, folder / "v2" / "tiny", b"v2" * 8
    )


def version_of(package: Path) -> str:
    return hashlib.sha256((package / "manifest.json").read_bytes()).hexdigest()


def ada(package: Path) -> dict:
    return next(e for e in manifest_of(package)["engines"] if e["target"] == "rtx-ada")


def current_sha(dest: Path) -> str:
    return hashlib.sha256((dest / "tiny" / "current" / "tiny.engine").read_bytes()).hexdigest()


# the racing republish -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_republish_racing_50_provisions_refuses_none(
    versions: tuple[Path, Path], s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Republishing v1/v2 to one URL in a loop while 50 provisions run: every provision installs a whole version."""
    from trtflow.deploy import provision as prov
    from trtflow.deploy.channels import publish_version
    from trtflow.deploy.rollout import Request, provision_channel

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    v1, v2 = versions
    url = f"s3://{s3.bucket()}/race/tiny"
    publish_version(v1, url, None)
    stop, published, errors, installed = threading.Event(), [], [], {}

    def republish() -> None:
        while not stop.is_set():
            for package in (v2, v1):
                published.append(publish_version(package, url, None)["version"])

    def device(index: int) -> None:
        request = Request(url, "stable", f"dev-{index}", "sm_89", tmp_path / f"d{index}")
        try:
            record = provision_channel(request, lambda m: prov.device_from_options("sm_89", m))
            installed[index] = record["written"]["sha256"]
        except Exception as exc:  # noqa: BLE001  every refusal is what this test counts
            errors.append(f"dev-{index}: {type(exc).__name__}: {exc}")

    publisher = threading.Thread(target=republish)
    publisher.start()
    devices = [threading.Thread(target=device, args=(i,)) for i in range(50)]
    # 5 waves of 10 provisions, each started after one more publish has finished: they overlap publishes
    for wave in range(5):
        seen = len(published)
        while len(published) == seen and publisher.is_alive():
            time.sleep(0.01)
        for thread in devices[wave * 10 : (wave + 1) * 10]:
            thread.start()
    for thread in devices:
        thread.join(timeout=120)
    stop.set()
    publisher.join(timeout=60)
    assert errors == [] and len(installed) == 50
    assert set(installed.values()) <= {ada(v1)["sha256"], ada(v2)["sha256"]} and len(published) >= 5
    assert all(current_sha(tmp_path / f"d{i}") == installed[i] for i in range(50))
    print(
        f"\nrace: {len(published)} republishes during 50 provisions, 0 refusals, "
        f"{sum(1 for s in installed.values() if s == ada(v2)['sha256'])} devices got v2"
    )


# the agent through canary -> promote -> rollback ------------------------------------------------------------------

DEVICES = {
    "cam-0": ("sm_89", "stable"),
    "cam-1": ("sm_86", "stable"),
    "cam-2": ("sm_89", "stable"),
    "cam-3": ("sm_86", "stable"),
    "lab-0": ("sm_89", "canary"),
}


def agents_once(s3, url: str, root: Path, *extra: str) -> dict[str, dict]:
    """`trtflow agent --once --report` on every device at once (own processes); their status by device id."""
    running = {
        d: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trtflow",
                "agent",
                url,
                "--once",
                "--report",
                "--json",
                "--dest",
                str(root / d),
                "--gpu",
                gpu,
                "--channel",
                channel,
                "--device-id",
                d,
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=s3.env(),
        )
        for d, (gpu, channel) in DEVICES.items()
    }
    done = {d: p.communicate(timeout=120) for d, p in running.items()}
    assert all(p.returncode == 0 for p in running.values()), {d: err for d, (_, err) in done.items()}
    return {d: json.loads(out) for d, (out, _) in done.items()}


def engine_bytes(s3) -> int:
    return sum(size for path, size in s3.served.items() if path.endswith(".engine"))


def expected_engine(package: Path, gpu: str) -> str:
    return next(e for e in manifest_of(package)["engines"] if e["compute_capabilities"] == [gpu])["sha256"]


@pytest.mark.slow
def test_canary_promote_rollback_on_simulated_devices(versions: tuple[Path, Path], s3, tmp_path: Path) -> None:
    v1, v2 = versions
    url, root = f"s3://{s3.bucket()}/fleet/tiny", tmp_path / "devices"
    for channel in ("stable", "canary"):
        assert cli("publish", str(v1), url, "--channel", channel, env=s3.env()).returncode == 0
    first = agents_once(s3, url, root)
    assert {d: s["version"] for d, s in first.items()} == {d: version_of(v1) for d in DEVICES}

    assert cli("publish", str(v2), url, "--channel", "canary", env=s3.env()).returncode == 0
    s3.reset()
    canary = agents_once(s3, url, root)
    assert {d: s["version"] for d, s in canary.items()} == {
        **{d: version_of(v1) for d in DEVICES},
        "lab-0": version_of(v2),
    }
    stable_polls = [r for r in s3.requests if r[1].endswith("/channels/stable.json")]
    # 4 stable devices: one GET each; only lab-0 fetched
    assert len(stable_polls) == 4 and engine_bytes(s3) == ada(v2)["size"]

    share = next(
        p
        for p in range(10, 100, 10)
        if 0
        < sum(takes_newest(d, "stable", version_of(v2), p * 100) for d, (_, c) in DEVICES.items() if c == "stable")
        < 4
    )
    promoted = cli("promote", url, "--channel", "stable", "--share", f"{share}%", "--json", env=s3.env())
    assert promoted.returncode == 0, promoted.stderr
    partial = agents_once(s3, url, root)
    chosen = {
        d: takes_newest(d, "stable", version_of(v2), share * 100) for d, (_, c) in DEVICES.items() if c == "stable"
    }
    assert {d: partial[d]["version"] for d in chosen} == {d: version_of(v2 if new else v1) for d, new in chosen.items()}

    assert cli("promote", url, "--channel", "stable", "--share", "100%", env=s3.env()).returncode == 0
    full = agents_once(s3, url, root)
    assert {d: s["version"] for d, s in full.items()} == {d: version_of(v2) for d in DEVICES}
    for d, (gpu, _) in DEVICES.items():
        assert current_sha(root / d) == expected_engine(v2, gpu)

    assert cli("rollback", url, "--channel", "stable", env=s3.env()).returncode == 0
    s3.reset()
    back = agents_once(s3, url, root)
    assert {d: s["version"] for d, s in back.items()} == {
        **{d: version_of(v1) for d in DEVICES},
        "lab-0": version_of(v2),
    }
    # kept engines: switched, nothing fetched
    assert engine_bytes(s3) == 0 and not [p for p in s3.served if "/versions/" in p]
    assert {s["action"] for d, s in back.items() if d != "lab-0"} == {"switched"}
    for d, (gpu, channel) in DEVICES.items():
        assert current_sha(root / d) == expected_engine(v1 if channel == "stable" else v2, gpu)
        assert json.loads((root / d / "status.json").read_text())["version"] == back[d]["version"]

    table = json.loads(cli("fleet", "status", url, "--json", env=s3.env()).stdout)
    counts = {(r["channel"], r["version"], r["gpu"]): r["devices"] for r in table["rows"]}
    assert counts == {
        ("canary", version_of(v2), "sm_89"): 1,
        ("stable", version_of(v1), "sm_86"): 2,
        ("stable", version_of(v1), "sm_89"): 2,
    }


def test_a_poll_with_nothing_new_is_one_conditional_get_without_a_body(
    versions: tuple[Path, Path], s3, tmp_path: Path
) -> None:
    v1, _ = versions
    url = f"s3://{s3.bucket()}/poll/tiny"
    assert cli("publish", str(v1), url, env=s3.env()).returncode == 0
    assert cli("provision", url, "--gpu", "sm_86", "--dest", str(tmp_path / "d"), env=s3.env()).returncode == 0
    s3.reset()
    again = cli("provision", url, "--gpu", "sm_86", "--dest", str(tmp_path / "d"), "--json", env=s3.env())
    assert again.returncode == 0 and json.loads(again.stdout)["action"] == "unchanged"
    assert len(s3.requests) == 1 and s3.requests[0][1].endswith("/channels/stable.json") and dict(s3.served) == {}
    ((request_head, response_head, status),) = s3.heads
    assert status == 304
    print(f"\nno-change poll: 1 request, {request_head} B request head, {response_head} B response head, 0 B body")


# the agent's guards -----------------------------------------------------------------------------------------------


def test_a_failing_health_check_keeps_the_old_engine_and_records_the_error(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    v1, v2 = versions
    url, dest = (tmp_path / "remote").as_uri(), tmp_path / "dest"
    assert cli("publish", str(v1), url).returncode == 0
    common = ("agent", url, "--once", "--dest", str(dest), "--gpu", "sm_89", "--device-id", "cam-9", "--json")
    assert cli(*common, "--health-cmd", f"{sys.executable} -c pass").returncode == 0
    assert cli("publish", str(v2), url).returncode == 0
    failed = cli(*common, "--health-cmd", f"{sys.executable} -c 'import sys; sys.exit(\"engine does not load\")'")
    assert (
        failed.returncode == 1
        and "engine does not load" in failed.stderr
        and "`current` left as it was" in failed.stderr
    )
    status = json.loads((dest / "status.json").read_text())
    assert (
        status["version"] == version_of(v1)
        and "engine does not load" in status["last_error"]
        and status["consecutive_failures"] == 1
    )
    assert current_sha(dest) == ada(v1)["sha256"] and (dest / "tiny" / ada(v2)["sha256"] / "tiny.engine").is_file()
    healed = cli(
        *common,
        "--health-cmd",
        f"{sys.executable} -c 'import os, sys; sys.exit(not os.path.isfile(os.environ[\"TRTFLOW_ENGINE\"]))'",
    )
    assert (
        healed.returncode == 0
        and json.loads(healed.stdout)["action"] == "switched"
        and current_sha(dest) == ada(v2)["sha256"]
    )


def test_one_agent_per_destination(versions: tuple[Path, Path], tmp_path: Path) -> None:
    from filelock import FileLock

    url, dest = (tmp_path / "remote").as_uri(), tmp_path / "dest"
    assert cli("publish", str(versions[0]), url).returncode == 0
    dest.mkdir()
    with FileLock(str(dest / ".agent.lock")):
        busy = cli("agent", url, "--once", "--dest", str(dest), "--gpu", "sm_89", "--device-id", "cam-1")
    assert busy.returncode == 6 and busy.stderr.count("\n") == 1 and "another trtflow agent holds" in busy.stderr
    assert not (dest / "tiny").exists()
    looped = cli(
        "agent",
        url,
        "--dest",
        str(dest),
        "--gpu",
        "sm_89",
        "--device-id",
        "cam-1",
        "--interval",
        "1",
        "--max-runtime",
        "2.5",
        "--json",
    )
    # rounds after the first find nothing new
    assert looped.returncode == 0 and json.loads(looped.stdout)["action"] == "unchanged"


# preflight, gc, fleet status ------------------------------------------------------------------------------------


def test_preflight_records_what_it_could_check_and_refuses_a_malformed_engine(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt_rtx")
    done = cli("provision", str(versions[0]), "--gpu", "sm_89", "--dest", str(tmp_path / "d"), "--json")
    checks = json.loads(done.stdout)["checks"]["preflight"]
    assert checks["version_check"].startswith("passed") and checks["engine_validity"].startswith(
        "not checked: no GPU here"
    )
    garbage = Path(shutil.copytree(versions[0], tmp_path / "bad" / "tiny"))
    manifest = manifest_of(garbage)
    for engine in manifest["engines"]:
        (garbage / engine["file"]).chmod(0o644)
        (garbage / engine["file"]).write_bytes(b"\0" * 4096)
        engine.update(sha256=hashlib.sha256(b"\0" * 4096).hexdigest(), size=4096)
    (garbage / "manifest.json").write_text(json.dumps(manifest))
    refused = cli("provision", str(garbage), "--gpu", "sm_89", "--dest", str(tmp_path / "d"))
    assert (
        refused.returncode == 5
        and "MALFORMED_ENGINE" in refused.stderr
        and current_sha(tmp_path / "d") == ada(versions[0])["sha256"]
    )


def test_remote_gc_keeps_what_channels_need(versions: tuple[Path, Path], tmp_path: Path) -> None:
    v1, v2 = versions
    v3 = variant(v1, tmp_path / "v3" / "tiny", b"v3")
    remote = tmp_path / "remote"
    for package in (v1, v2, v3):
        assert cli("publish", str(package), remote.as_uri()).returncode == 0
    dry = json.loads(cli("remote", "gc", remote.as_uri(), "--keep", "2", "--grace", "0", "--json").stdout)
    assert dry["versions_to_delete"] == [version_of(v1)] and (remote / "versions" / version_of(v1)).is_dir()
    done = json.loads(cli("remote", "gc", remote.as_uri(), "--keep", "2", "--grace", "0", "--yes", "--json").stdout)
    assert done["versions_deleted"] == [version_of(v1)] and not (remote / "versions" / version_of(v1)).exists()
    assert sorted(p.name for p in (remote / "engines").iterdir()) == sorted(
        f"{e['sha256']}.engine" for p in (v2, v3) for e in manifest_of(p)["engines"]
    )
    assert cli("rollback", remote.as_uri()).returncode == 0
    assert cli("provision", remote.as_uri(), "--gpu", "sm_86", "--dest", str(tmp_path / "d")).returncode == 0
    assert current_sha(tmp_path / "d") == expected_engine(v2, "sm_86")


GOOD_REPORT = {
    "device_id": "a",
    "channel": "stable",
    "version": "a" * 64,
    "gpu": "sm_86",
    "last_check": "2026-11-25T10:00:00+00:00",
}


def test_fleet_status_sets_aside_hostile_reports(tmp_path: Path) -> None:
    devices = tmp_path / "remote" / "devices"
    devices.mkdir(parents=True)
    good = dict(GOOD_REPORT)
    (devices / "a.json").write_text(json.dumps(good))
    (devices / "bomb.json").write_bytes(b"[" * 30000 + b"]" * 30000)
    (devices / "huge.json").write_bytes(b'{"x": "' + b"x" * (1 << 20) + b'"}')
    (devices / "odd.json").write_text(json.dumps({**good, "gpu": {"nested": [1, 2]}, "version": 7}))
    result = cli("fleet", "status", devices.parent.as_uri(), "--json")
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    assert table["devices"] == 2 and len(table["refused"]) == 2 and any("nested deeper" in r for r in table["refused"])
    assert {(r["channel"], r["gpu"]) for r in table["rows"]} == {("stable", "sm_86"), ("stable", "{'nested': [1, 2]}")}


def test_remote_gc_removes_deleted_versions_from_histories_and_rollback_refuses_a_gone_one(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """gc --keep 2 deletes v1 and takes it out of the channel's history in the same step: two rollbacks never point a
    channel at a version that is gone (before: both exited 0 and every agent then exited 3)."""
    v1, v2 = versions
    v3 = variant(v1, tmp_path / "v3" / "tiny", b"v3")
    remote = tmp_path / "remote"
    for package in (v1, v2, v3):
        assert cli("publish", str(package), remote.as_uri()).returncode == 0
    assert cli("remote", "gc", remote.as_uri(), "--keep", "2", "--grace", "0", "--yes").returncode == 0
    channel = json.loads((remote / "channels" / "stable.json").read_text())
    assert channel["history"] == [version_of(v3), version_of(v2)]
    assert cli("rollback", remote.as_uri()).returncode == 0
    second = cli("rollback", remote.as_uri())
    assert second.returncode == 2 and "no previous version" in second.stderr, second.stderr
    assert json.loads((remote / "channels" / "stable.json").read_text())["history"] == [version_of(v2)]
    # a history naming a version someone deleted by hand: rollback refuses it, gc takes it out
    (remote / "channels" / "stable.json").write_text(
        Channel("stable", (version_of(v2), version_of(v1))).to_json().decode()
    )
    gone = cli("rollback", remote.as_uri())
    assert gone.returncode == 2 and "gone from the remote" in gone.stderr, gone.stderr
    assert cli("remote", "gc", remote.as_uri(), "--keep", "2", "--grace", "0", "--yes").returncode == 0
    assert json.loads((remote / "channels" / "stable.json").read_text())["history"] == [version_of(v2)]


def test_a_refused_write_leaves_no_temporary_file_at_the_remote(versions: tuple[Path, Path], tmp_path: Path) -> None:
    """publish refusing a symlinked version manifest, and an agent refusing a symlinked device report round after
    round, leave no `.tmp` at the remote (before: one per refusal)."""
    v1, v2 = versions
    remote = tmp_path / "remote"
    assert cli("publish", str(v1), remote.as_uri()).returncode == 0
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (remote / "versions" / version_of(v2)).mkdir(parents=True)
    (remote / "versions" / version_of(v2) / "manifest.json").symlink_to(outside)
    refused = cli("publish", str(v2), remote.as_uri())
    assert refused.returncode == 3 and "symlink" in refused.stderr, refused.stderr
    (remote / "devices").mkdir()
    (remote / "devices" / "cam-1.json").symlink_to(outside)
    for _ in range(2):
        cli(
            "agent", remote.as_uri(), "--once", "--report", "--gpu", "sm_89", "--dest", str(tmp_path / "d"),
            "--device-id", "cam-1",
        )  # fmt: skip
    assert outside.read_text() == "{}"
    assert not [p for p in remote.rglob("*.tmp")], sorted(remote.rglob("*.tmp"))


def test_provisioning_the_same_url_twice_is_a_no_op(versions: tuple[Path, Path], tmp_path: Path) -> None:
    """The second `provision URL` (and one after a rollback) switches nothing new and exits 0 (before: exit 70,
    KeyError 'device', after `current` had switched)."""
    v1, v2 = versions
    remote = tmp_path / "remote"
    for package in (v1, v2):
        assert cli("publish", str(package), remote.as_uri()).returncode == 0
    provision = ("provision", remote.as_uri(), "--gpu", "sm_89", "--dest", str(tmp_path / "d"))
    assert cli(*provision).returncode == 0
    again = cli(*provision)
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stderr
    assert cli("rollback", remote.as_uri()).returncode == 0
    back = cli(*provision)
    assert back.returncode == 0 and current_sha(tmp_path / "d") == ada(v1)["sha256"], back.stderr
    assert cli(*provision).returncode == 0


def test_fleet_status_shows_a_reports_control_characters_and_keeps_one_row_per_group(tmp_path: Path) -> None:
    """A report's escape sequences reach the terminal as text, and a newline in a field forges no row."""
    devices = tmp_path / "remote" / "devices"
    devices.mkdir(parents=True)
    report = {
        **GOOD_REPORT,
        "channel": "stable\x1b[2J\x1b]0;pwned\x07",
        "gpu": "sm_86\nforged      bbbbbbbbbbbb   sm_90     999999",
    }
    (devices / "a.json").write_text(json.dumps(report))
    result = cli("fleet", "status", devices.parent.as_uri())
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\\x1b" in result.stdout
    assert len(result.stdout.splitlines()) == 2 and "999999" not in result.stdout, result.stdout
