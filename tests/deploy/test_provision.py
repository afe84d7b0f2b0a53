"""Provision: choosing an engine from the manifest alone (unit), and the real CLI on a real package (end to end)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ARCHIVE, TINY_RECIPE, trtflow, write_project

from trtflow.deploy.provision import AMPERE_PLUS, EXACT, BadRequest, Device, NoEngineFits, choose, device_from_options
from trtflow.manifest import BuilderOptions, Engine, Manifest, Source
from trtflow.util.archive import write_reproducible_tar

# ---------------------------------------------------------------------------------------------
# selection on hand-written manifests


def engine(
    target: str,
    ccs: list[str],
    backend: str = "tensorrt-rtx",
    version: str = "1.7.1.116",
    hw: str = "none",
    vc: bool = False,
    precision: str = "fp32",
) -> Engine:
    """Only the fields selection reads (model_construct: the manifest may grow fields provision ignores)."""
    return Engine.model_construct(
        file=f"engines/{target}/m-{precision}.engine",
        sha256="0" * 64,
        size=1,
        precision=precision,
        target=target,
        compute_capabilities=ccs,
        backend=backend,
        backend_version=version,
        hardware_compatibility=hw,
        version_compatible=vc,
        builder=BuilderOptions(workspace_mib=None, optimization_level=3),
        tensors=[],
        stage_key="k",
    )


def manifest(*engines: Engine) -> Manifest:
    return Manifest(
        recipe="m",
        trtflow_version="0.1.0",
        source=Source(sha256="a", cleaned_sha256="b", nodes=1),
        engines=list(engines),
    )


def device(*ccs: str, runtime: str | None = None, backend: str | None = None, precision: str | None = None) -> Device:
    return Device(tuple(ccs), "+".join(ccs), "given", runtime, backend, precision)


RTX = manifest(engine("rtx-ampere", ["sm_86"]), engine("rtx-ada", ["sm_89"]))
A100 = engine("a100", ["sm_80"], backend="tensorrt", version="10.13.3.9", hw="ampere_plus")


def reasons(others) -> dict[str, str]:
    return {verdict.engine.target: reason for verdict, reason in others}


def test_exact_compute_capability_match_is_chosen() -> None:
    chosen, others = choose(RTX, device("sm_89"))
    assert (chosen.engine.target, chosen.fit) == ("rtx-ada", EXACT)
    assert reasons(others) == {"rtx-ampere": "built for sm_86 only, not sm_89 (hardware_compatibility: none)"}


@pytest.mark.parametrize("cc", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"])
def test_ampere_plus_build_fits_every_gpu_from_sm80(cc: str) -> None:
    chosen, _ = choose(manifest(A100), device(cc))
    assert chosen.fit == (EXACT if cc == "sm_80" else AMPERE_PLUS)


def test_ampere_plus_build_refuses_older_gpus() -> None:
    with pytest.raises(NoEngineFits, match="ampere_plus build needs sm_80 or newer, sm_75 is older"):
        choose(manifest(A100), device("sm_75"))


def test_same_compute_capability_build_runs_only_on_its_listed_capability() -> None:
    same = engine("l4", ["sm_89"], backend="tensorrt", version="10.13.3.9", hw="same_compute_capability")
    assert choose(manifest(same), device("sm_89"))[0].fit == EXACT
    with pytest.raises(
        NoEngineFits, match="built for sm_89 only, not sm_86 \\(hardware_compatibility: same_compute_capability\\)"
    ):
        choose(manifest(same), device("sm_86"))


def test_exact_match_beats_a_newer_hardware_compatible_build() -> None:
    chosen, others = choose(manifest(A100, engine("rtx-ampere", ["sm_86"])), device("sm_86"))
    assert chosen.engine.target == "rtx-ampere"
    assert reasons(others)["a100"] == f"fits ({AMPERE_PLUS}), but an exact compute capability match is preferred"


def test_sm90_is_refused_with_a_reason_per_engine() -> None:
    with pytest.raises(NoEngineFits) as caught:
        choose(manifest(A100.model_copy(update={"hardware_compatibility": "none"}), *RTX.engines), device("sm_90"))
    lines = str(caught.value).splitlines()
    assert (
        caught.value.exit_code == 5 and lines[0] == "no engine in package m fits sm_90 (runtime version not checked):"
    )
    assert lines[1:4] == [
        "  engines/a100/m-fp32.engine (fp32, tensorrt 10.13.3.9, sm_80): built for sm_80 only, not sm_90 "
        "(hardware_compatibility: none)",
        "  engines/rtx-ampere/m-fp32.engine (fp32, tensorrt-rtx 1.7.1.116, sm_86): built for sm_86 only, not sm_90 "
        "(hardware_compatibility: none)",
        "  engines/rtx-ada/m-fp32.engine (fp32, tensorrt-rtx 1.7.1.116, sm_89): built for sm_89 only, not sm_90 "
        "(hardware_compatibility: none)",
    ]
    assert "trtflow run" in lines[4]


@pytest.mark.parametrize(
    "runtime, fits", [("10.13.3", True), ("10.13.3.1", True), ("10.13.2", False), ("10.14.0", False), ("11.0", False)]
)
def test_tensorrt_needs_the_same_version(runtime: str, fits: bool) -> None:
    built = manifest(engine("a100", ["sm_80"], backend="tensorrt", version="10.13.3.9"))
    if fits:
        assert choose(built, device("sm_80", runtime=runtime))[0].fit == EXACT
    else:
        with pytest.raises(
            NoEngineFits,
            match=f"tensorrt 10.13.3.9 engines load only on the same release \\(10.13.3\\), not runtime {runtime}",
        ):
            choose(built, device("sm_80", runtime=runtime))


# The support matrix (TensorRT 11.4, Engine Portability): a version-compatible engine loads on newer runtimes of its
# major, and across majors only 8 -> 10 and 10 -> 11; version compatibility exists from 8.6.
VERSION_COMPATIBILITY = [
    ("10.13.3.9", "10.13.3", True),
    ("10.13.3.9", "10.14", True),
    ("10.13.3.9", "10.20.1.5", True),
    ("10.13.3.9", "10.13.2", False),
    ("10.13.3.9", "11.0.0", True),
    ("10.13.3.9", "11.4.1", True),
    ("10.13.3.9", "12.0", False),
    ("10.13.3.9", "9.9", False),
    ("8.6.1", "8.6.2", True),
    ("8.6.1", "10.3.0", True),
    ("8.6.1", "9.0.0", False),
    ("8.6.1", "11.0.0", False),
    ("8.5.3", "8.5.3", True),
    ("8.5.3", "8.6.1", False),  # before 8.6 the flag does not exist: same release only
    ("11.0.0", "11.1.0", True),
    ("11.0.0", "10.13.3", False),
    ("11.0.0", "12.0.0", False),
]


@pytest.mark.parametrize("built, runtime, fits", VERSION_COMPATIBILITY)
def test_version_compatible_tensorrt_follows_the_support_matrix(built: str, runtime: str, fits: bool) -> None:
    engines = manifest(engine("a100", ["sm_80"], backend="tensorrt", version=built, vc=True))
    if fits:
        assert choose(engines, device("sm_80", runtime=runtime))[0].fit == EXACT
    else:
        with pytest.raises(NoEngineFits, match=f"tensorrt {built}"):
            choose(engines, device("sm_80", runtime=runtime))


@pytest.mark.parametrize(
    "runtime, fits", [("1.7.1", True), ("1.7.1.200", True), ("1.7.0", False), ("1.8.0", False), ("2.0", False)]
)
def test_tensorrt_rtx_needs_the_same_release(runtime: str, fits: bool) -> None:
    if fits:
        assert choose(RTX, device("sm_89", runtime=runtime))[0].engine.target == "rtx-ada"
    else:
        with pytest.raises(
            NoEngineFits,
            match=f"tensorrt-rtx 1.7.1.116 engines load only on the same release \\(1.7.1\\), not runtime {runtime}",
        ):
            choose(RTX, device("sm_89", runtime=runtime))


def test_without_a_runtime_version_no_version_rule_applies() -> None:
    old = manifest(engine("rtx-ada", ["sm_89"], version="0.1.0.1"))
    assert choose(old, device("sm_89"))[0].fit == EXACT


def test_newest_backend_version_wins_then_manifest_order() -> None:
    old, new = engine("old", ["sm_86"], version="1.6.0.1"), engine("new", ["sm_86"], version="1.7.1.116")
    chosen, others = choose(manifest(old, new), device("sm_86"))
    assert (
        chosen.engine.target == "new"
        and reasons(others)["old"] == "fits, but tensorrt-rtx 1.7.1.116 is newer than 1.6.0.1"
    )
    first, second = engine("a", ["sm_86"], precision="fp16"), engine("b", ["sm_86"], precision="fp16")
    chosen, others = choose(manifest(first, second), device("sm_86"))
    assert chosen.engine.target == "a" and [r for _, r in others] == [
        "fits equally well, but comes later in the manifest"
    ]


def test_fewest_bits_win_by_default_and_prefer_reorders() -> None:
    engines = manifest(*(engine("t", ["sm_89"], precision=p) for p in ("fp32", "fp16", "int8")))
    chosen, others = choose(engines, device("sm_89"))
    assert chosen.engine.precision == "int8"
    assert [r for _, r in others] == [
        f"fits, but int8 is preferred to {p} (--prefer fp8,int8,fp16,bf16,fp32)" for p in ("fp32", "fp16")
    ]
    preferred = device_from_options("sm_89", engines, prefer="fp16,fp32")
    assert (
        preferred.prefer == ("fp16", "fp32", "fp8", "int8", "bf16")
        and choose(engines, preferred)[0].engine.precision == "fp16"
    )
    with pytest.raises(BadRequest, match="--prefer 'fp17'"):
        device_from_options("sm_89", engines, prefer="fp17")


def _verified(precision: str, accuracy_passed: bool) -> Engine:
    """An engine whose recorded accuracy check passed or failed (kept in the package by on_fail: warn)."""
    from types import SimpleNamespace

    proofs = SimpleNamespace(
        cleanup_equality=SimpleNamespace(passed=True),
        precision_accuracy=SimpleNamespace(passed=accuracy_passed),
        engine_run=SimpleNamespace(passed=None),
        engine_checks={"problems": []},
    )
    return engine("t", ["sm_89"], precision=precision).model_copy(update={"verification": proofs})


def test_an_engine_that_failed_verification_is_never_chosen_unless_allowed() -> None:
    engines = manifest(_verified("int8", accuracy_passed=False), _verified("fp16", accuracy_passed=True))
    chosen, others = choose(engines, device("sm_89"))
    assert chosen.engine.precision == "fp16"
    assert [r for _, r in others] == ["failed verification (accuracy vs fp32); --allow-failed to take it anyway"]
    with pytest.raises(NoEngineFits, match="failed verification"):
        choose(manifest(_verified("int8", accuracy_passed=False)), device("sm_89"))
    allowed = device_from_options("sm_89", engines, allow_failed=True)
    assert choose(engines, allowed)[0].engine.precision == "int8"


def test_precision_and_backend_filters_say_why_an_engine_was_skipped() -> None:
    fp16, fp32 = engine("t", ["sm_86"], precision="fp16"), engine("t", ["sm_86"], precision="fp32")
    chosen, others = choose(manifest(fp16, fp32), device("sm_86", precision="fp32"))
    assert chosen.engine.precision == "fp32" and [r for _, r in others] == ["precision fp16, not the requested fp32"]
    chosen, others = choose(manifest(A100, *RTX.engines), device("sm_86", backend="tensorrt"))
    assert chosen.engine.target == "a100" and set(reasons(others).values()) == {
        "backend tensorrt-rtx, not the requested tensorrt"
    }


def test_gpu_option_accepts_capabilities_and_target_names() -> None:
    assert device_from_options("8.9", RTX).compute_capabilities == ("sm_89",)
    by_target = device_from_options("rtx-ada", RTX)
    assert (by_target.compute_capabilities, by_target.label, by_target.source) == (
        ("sm_89",),
        "rtx-ada (sm_89)",
        "target rtx-ada of the manifest",
    )
    with pytest.raises(BadRequest, match="its targets: rtx-ada, rtx-ampere"):
        device_from_options("h100", RTX)
    with pytest.raises(BadRequest, match="--runtime-version 'latest' is not a version"):
        device_from_options("sm_89", RTX, runtime_version="latest")


def test_an_engine_must_fit_every_capability_of_the_device() -> None:
    wide = manifest(engine("narrow", ["sm_86"]), engine("wide", ["sm_86", "sm_89"]))
    chosen, others = choose(wide, device("sm_86", "sm_89"))
    assert chosen.engine.target == "wide" and reasons(others) == {
        "narrow": "built for sm_86 only, not sm_89 (hardware_compatibility: none)"
    }


# ---------------------------------------------------------------------------------------------
# end to end: a real package built by `trtflow run` (tiny, rtx-ampere sm_86 + rtx-ada sm_89)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_project(tmp_path_factory.mktemp("provision") / "proj", {"tiny": TINY_RECIPE + ARCHIVE})
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    return root / "artifacts" / "packages"


def tiny_manifest(packages: Path) -> dict:
    return json.loads((packages / "tiny" / "manifest.json").read_text())


def entry(packages: Path, target: str) -> dict:
    return next(e for e in tiny_manifest(packages)["engines"] if e["target"] == target)


def provision(packages: Path, *args: str):
    return trtflow(packages, "provision", *args)


def installed(dest: Path, recipe: str = "tiny") -> Path:
    """The engine a serving process would load: <dest>/<recipe>/current/<recipe>.engine."""
    return dest / recipe / "current" / f"{recipe}.engine"


def test_sm89_gets_the_rtx_ada_engine_with_a_record_of_why(packages: Path, tmp_path: Path) -> None:
    result = provision(packages, str(packages / "tiny"), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 0, result.err
    assert (
        result.out.splitlines()[0] == "chose engines/rtx-ada/tiny-fp32.engine for sm_89: exact compute capability match"
    )
    sha = entry(packages, "rtx-ada")["sha256"]
    version = tmp_path / "dest" / "tiny" / sha
    assert f"installed {version}; {installed(tmp_path / 'dest')} now points to it" in result.out
    assert hashlib.sha256(installed(tmp_path / "dest").read_bytes()).hexdigest() == sha
    # relative: the folder can be moved or mounted elsewhere
    assert os.readlink(tmp_path / "dest" / "tiny" / "current") == sha
    record = json.loads((version / "provision.json").read_text())
    assert record["device"] == {
        "gpu": "sm_89",
        "compute_capabilities": ["sm_89"],
        "source": "given",
        "backend": None,
        "precision": None,
    }
    assert record["runtime"] == {"version": None, "version_rules": "not applied: no --runtime-version given"}
    assert record["chosen"]["manifest_entry"] == entry(packages, "rtx-ada")
    assert record["not_chosen"] == [
        {
            "file": "engines/rtx-ampere/tiny-fp32.engine",
            "target": "rtx-ampere",
            "precision": "fp32",
            "reason": "built for sm_86 only, not sm_89 (hardware_compatibility: none)",
        }
    ]
    assert sorted(p.name for p in (tmp_path / "dest" / "tiny").iterdir()) == sorted([".lock", sha, "current"])
    assert sorted(p.name for p in version.iterdir()) == ["provision.json", "tiny.engine"]


def test_json_output_is_the_record_and_runtime_rules_apply_when_given(packages: Path, tmp_path: Path) -> None:
    version, sha = entry(packages, "rtx-ada")["backend_version"], entry(packages, "rtx-ada")["sha256"]
    result = provision(
        packages,
        str(packages / "tiny"),
        "--gpu",
        "rtx-ada",
        "--runtime-version",
        version,
        "--dest",
        str(tmp_path),
        "--json",
    )
    assert result.code == 0, result.err
    printed = json.loads(result.out)
    # nothing fetched
    assert (printed.pop("action"), printed.pop("transfer"), printed.pop("exit_code")) == (
        "installed",
        None,
        0,
    )
    assert printed.pop("checks")["preflight"]["version_check"].startswith("passed")  # issue 29: the preflight's answers
    assert printed.pop("written") == {
        "engine": str(installed(tmp_path)),
        "version": str(tmp_path / "tiny" / sha),
        "record": str(tmp_path / "tiny" / sha / "provision.json"),
        "sha256": sha,
    }
    assert printed == json.loads((tmp_path / "tiny" / sha / "provision.json").read_text())
    assert printed["runtime"] == {"version": version, "version_rules": "applied"}
    major, minor = version.split(".")[:2]
    newer = provision(
        packages,
        str(packages / "tiny"),
        "--gpu",
        "sm_89",
        "--runtime-version",
        f"{major}.{int(minor) + 1}.0",
        "--dest",
        str(tmp_path / "d2"),
    )
    assert newer.code == 5 and "engines load only on the same release" in newer.err


def test_the_same_engine_again_is_a_no_op_another_flips_current_and_old_versions_are_pruned(
    packages: Path, tmp_path: Path
) -> None:
    dest, folder = tmp_path / "dest", tmp_path / "dest" / "tiny"
    ada, ampere = entry(packages, "rtx-ada")["sha256"], entry(packages, "rtx-ampere")["sha256"]

    def to(gpu: str, *extra: str) -> dict:
        result = provision(packages, str(packages / "tiny"), "--gpu", gpu, "--dest", str(dest), "--json", *extra)
        assert result.code == 0, result.err
        return json.loads(result.out)

    assert to("sm_89")["action"] == "installed"
    first = (folder / ada / "tiny.engine").stat()
    assert to("sm_89")["action"] == "unchanged"
    assert (folder / ada / "tiny.engine").stat().st_mtime_ns == first.st_mtime_ns  # not rewritten
    assert to("sm_86")["action"] == "installed" and os.readlink(folder / "current") == ampere
    assert to("sm_89")["action"] == "switched" and os.readlink(folder / "current") == ada  # a rollback copies nothing
    assert (folder / ada / "tiny.engine").stat().st_ino == first.st_ino
    assert to("sm_86", "--keep", "1")["action"] == "switched"
    # --keep 1: only current
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        ampere,
        "current",
    ]


def test_a_watcher_reading_current_always_sees_a_whole_engine(packages: Path, tmp_path: Path) -> None:
    """A serving process polling current/tiny.engine while provisions flip between two engines never reads a partial
    or missing file: every read is one of the two engines, byte for byte."""
    import threading

    from trtflow.deploy import provision as prov

    package, dest = prov.load_package(packages / "tiny"), tmp_path / "dest"
    digests = {entry(packages, "rtx-ada")["sha256"], entry(packages, "rtx-ampere")["sha256"]}
    prov.provision(package, prov.device_from_options("sm_89", package.manifest), dest, keep=1)
    seen, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(hashlib.sha256(installed(dest).read_bytes()).hexdigest())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for gpu in ["sm_86", "sm_89"] * 10:  # keep=1: every flip also deletes the version just left
            prov.provision(package, prov.device_from_options(gpu, package.manifest), dest, keep=1)
    finally:
        stop.set()
        watcher.join()
    assert len(seen) > 20 and set(seen) <= digests


def test_sm90_is_refused_with_a_reason_per_engine_and_nothing_written(packages: Path, tmp_path: Path) -> None:
    result = provision(packages, str(packages / "tiny"), "--gpu", "sm_90", "--dest", str(tmp_path / "dest"))
    assert result.code == 5
    assert "error: no engine in package tiny fits sm_90" in result.err
    for target, cc in (("rtx-ampere", "sm_86"), ("rtx-ada", "sm_89")):
        assert (
            f"engines/{target}/tiny-fp32.engine (fp32, tensorrt-rtx " in result.err
            and f"built for {cc} only, not sm_90" in result.err
        )
    assert not (tmp_path / "dest").exists()


def test_provisioning_from_the_archive_and_from_manifest_json(packages: Path, tmp_path: Path) -> None:
    for source, dest in (
        (packages / "tiny.tar.gz", tmp_path / "a"),
        (packages / "tiny" / "manifest.json", tmp_path / "b"),
    ):
        result = provision(packages, str(source), "--gpu", "8.6", "--dest", str(dest))
        assert result.code == 0, result.err
        assert hashlib.sha256(installed(dest).read_bytes()).hexdigest() == entry(packages, "rtx-ampere")["sha256"]


def _tampered_copy(packages: Path, where: Path) -> Path:
    """The package folder with one byte of the rtx-ada engine flipped (its manifest unchanged)."""
    folder = shutil.copytree(packages / "tiny", where / "tiny")
    engine_file = folder / "engines" / "rtx-ada" / "tiny-fp32.engine"
    engine_file.chmod(engine_file.stat().st_mode | stat.S_IWUSR)
    data = bytearray(engine_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine_file.write_bytes(bytes(data))
    return folder


def test_a_tampered_engine_in_a_folder_is_refused(packages: Path, tmp_path: Path) -> None:
    folder = _tampered_copy(packages, tmp_path)
    (tmp_path / "dest").mkdir()
    result = provision(packages, str(folder), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 3
    assert (
        f"{folder / 'engines/rtx-ada/tiny-fp32.engine'}: sha256 " in result.err
        and "does not match the manifest's" in result.err
    )
    assert list((tmp_path / "dest").iterdir()) == []


def test_a_tampered_engine_in_an_archive_is_refused(packages: Path, tmp_path: Path) -> None:
    archive = tmp_path / "tiny.tar.gz"
    write_reproducible_tar(_tampered_copy(packages, tmp_path), archive, prefix="tiny")
    result = provision(packages, str(archive), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 3 and "tiny.tar.gz/engines/rtx-ada/tiny-fp32.engine: sha256 " in result.err
    assert not (tmp_path / "dest").exists()


def test_auto_without_nvidia_smi_says_there_is_no_gpu(
    packages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi, as on this CPU-only machine
    result = provision(packages, str(packages / "tiny"), "--gpu", "auto", "--dest", str(tmp_path / "dest"))
    assert result.code == 4
    assert result.err.startswith("error: no GPU: nvidia-smi not found; pass --gpu sm_XY")


def test_auto_detects_the_gpu_with_nvidia_smi(packages: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi answering as an RTX 4090 would: the only way to cover detection without a GPU."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 8.9\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    result = provision(packages, str(packages / "tiny"), "--dest", str(tmp_path / "dest"), "--json")
    assert result.code == 0, result.err
    record = json.loads(result.out)
    assert (record["device"]["gpu"], record["device"]["source"], record["chosen"]["file"]) == (
        "sm_89",
        "auto-detected",
        "engines/rtx-ada/tiny-fp32.engine",
    )


def _evil_archive(tmp_path: Path, packages: Path) -> Path:
    """A package whose manifest names ../../escape.engine, with a member at that path too."""
    payload = b"not an engine"
    manifest = tiny_manifest(packages)
    manifest["engines"] = [
        dict(
            manifest["engines"][1],
            file="../../escape.engine",
            sha256=hashlib.sha256(payload).hexdigest(),
            size=len(payload),
        )
    ]
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in (
            ("tiny/manifest.json", json.dumps(manifest).encode()),
            ("tiny/../../escape.engine", payload),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_a_manifest_naming_a_file_outside_the_package_is_refused(packages: Path, tmp_path: Path) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    result = provision(packages, str(_evil_archive(work, packages)), "--gpu", "sm_89", "--dest", str(work / "dest"))
    assert (
        result.code == 3 and "manifest names engine file '../../escape.engine', which escapes the package" in result.err
    )
    assert not (work / "dest").exists() and not list(tmp_path.rglob("escape.engine"))


def test_an_engine_symlinked_from_outside_the_package_folder_is_refused(packages: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(packages / "tiny", tmp_path / "tiny")
    outside = tmp_path / "outside.engine"
    shutil.move(folder / "engines" / "rtx-ada" / "tiny-fp32.engine", outside)
    (folder / "engines" / "rtx-ada" / "tiny-fp32.engine").symlink_to(outside)
    result = provision(packages, str(folder), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 3 and "the engine file is missing or outside the package" in result.err
    assert not (tmp_path / "dest").exists()


def test_provision_help() -> None:
    result = subprocess.run([sys.executable, "-m", "trtflow", "provision", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--gpu" in result.stdout and "--runtime-version" in result.stdout


def test_an_engine_larger_than_its_manifest_says_is_refused_before_it_is_all_written(
    packages: Path, tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(packages / "tiny", tmp_path / "tiny"))
    engine = folder / "engines/rtx-ada/tiny-fp32.engine"
    os.chmod(engine, 0o644)
    with open(engine, "ab") as grown:
        grown.write(b"\0" * (8 << 20))  # 8 MiB more than the manifest's size
    (tmp_path / "dest").mkdir()
    result = provision(packages, str(folder), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 3 and "larger than the" in result.err and "bytes the manifest records" in result.err
    assert list((tmp_path / "dest").iterdir()) == []


def test_a_huge_manifest_is_refused_without_reading_it(packages: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(packages / "tiny", tmp_path / "tiny"))
    with open(folder / "manifest.json", "r+b") as manifest:
        manifest.truncate(65 << 20)  # sparse: 65 MiB on paper
    result = provision(packages, str(folder), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert result.code == 3 and "a manifest is at most 67108864" in result.err
