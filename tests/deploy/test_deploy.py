"""Deploy: ONNX Runtime EP-context models, Triton model repositories, and provisioning from a published package.

Packages are real (`trtflow run` of the tiny project: TensorRT-RTX fp32 for sm_86 and sm_89). Full TensorRT cannot
build here, so the Triton tests relabel real engines as full-TensorRT builds for other GPUs in their manifests (the
export reads only the manifest and copies the bytes). The S3 server is moto on 127.0.0.1 counting what it serves;
provisions run as separate processes with only the endpoint and credentials in their environment.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import trtflow

from trtflow.util.archive import write_reproducible_tar

PACKAGE = Path("artifacts/packages/tiny")


def manifest_of(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """trtflow as its own process, as a fleet agent or CI job runs it."""
    return subprocess.run(
        [sys.executable, "-m", "trtflow", *args], capture_output=True, text=True, env=env, timeout=120
    )


def full_tensorrt_package(source: Path, dest: Path, builds: dict[str, str], edit=None) -> Path:
    """A copy of `source` whose engines are relabelled as full TensorRT 10.13 builds: {new target: compute capability},
    taking the source's engines in order. `edit(engine)` may change each manifest entry further."""
    folder = Path(shutil.copytree(source, dest))
    manifest = manifest_of(folder)
    engines = []
    for (target, cc), engine in zip(builds.items(), manifest["engines"], strict=False):
        engine = copy.deepcopy(engine)
        engine.update(backend="tensorrt", backend_version="10.13.3.9", target=target, compute_capabilities=[cc])
        engines.append(edit(engine) if edit else engine)
    manifest["engines"] = engines
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder


# ONNX Runtime EP-context --------------------------------------------------------------------


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def declared(value: onnx.ValueInfoProto) -> tuple[str, int, list]:
    dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
    return value.name, value.type.tensor_type.elem_type, dims


def expected_io(engine: dict, mode: str) -> list[tuple[str, int, list]]:
    types = {
        "float32": onnx.TensorProto.FLOAT,
        "float16": onnx.TensorProto.FLOAT16,
        "int64": onnx.TensorProto.INT64,
        "int32": onnx.TensorProto.INT32,
    }
    return [
        (
            t["name"],
            types[t["dtype"]],
            [("batch" if i == 0 else f"{t['name']}_dim{i}") if d < 0 else d for i, d in enumerate(t["shape"])],
        )
        for t in engine["tensors"]
        if t["mode"] == mode
    ]


def check_context_model(path: Path, engine: dict, source: str) -> bytes:
    """The model passes the checker, has one EPContext node wired to the engine's I/O; returns the engine bytes it
    carries."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} >= {("com.microsoft", 1)}
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("EPContext", "com.microsoft")
    assert [declared(v) for v in model.graph.input] == expected_io(engine, "input")
    assert [declared(v) for v in model.graph.output] == expected_io(engine, "output")
    assert list(node.input) == [t["name"] for t in engine["tensors"] if t["mode"] == "input"]
    assert list(node.output) == [t["name"] for t in engine["tensors"] if t["mode"] == "output"]
    attrs = attributes(node)
    assert attrs["source"].decode() == source and attrs["ep_sdk_version"].decode() == engine["backend_version"]
    assert attrs["hardware_architecture"].decode() == engine["compute_capabilities"][0].removeprefix("sm_")
    if attrs["embed_mode"] == 1:
        return attrs["ep_cache_context"]
    relative = attrs["ep_cache_context"].decode()
    assert "/" not in relative and ".." not in relative  # the provider refuses absolute paths and `..`
    return (path.parent / relative).read_bytes()


@pytest.mark.parametrize("embed", [False, True], ids=["beside", "embedded"])
def test_ort_context_models_carry_each_engine_and_its_io(built: Path, tmp_path: Path, embed: bool) -> None:
    package = built / PACKAGE
    result = trtflow(
        built,
        "export",
        "ort-context",
        str(package),
        "--dest",
        str(tmp_path / "ctx"),
        "--json",
        *(["--embed"] if embed else []),
    )
    assert result.code == 0, result.err
    written = json.loads(result.out)
    engines = manifest_of(package)["engines"]
    assert len(written) == len(engines) == 2
    for item, engine in zip(written, engines, strict=True):
        carried = check_context_model(Path(item["model"]), engine, "NvTensorRTRTXExecutionProvider")
        assert hashlib.sha256(carried).hexdigest() == engine["sha256"] == item["sha256"]
    names = sorted(p.name for p in (tmp_path / "ctx").iterdir())
    assert names == sorted(
        f"tiny-{e['target']}-fp32{suffix}"
        for e in engines
        for suffix in (["_ctx.onnx"] + ([] if embed else [".engine"]))
    )


def test_ort_context_for_full_tensorrt_names_the_tensorrt_provider(built: Path, tmp_path: Path) -> None:
    package = full_tensorrt_package(built / PACKAGE, tmp_path / "tiny", {"t4": "sm_75", "a10": "sm_86"})
    result = trtflow(built, "export", "ort-context", str(package), "--dest", str(tmp_path / "ctx"), "--json")
    assert result.code == 0, result.err
    for item, engine in zip(json.loads(result.out), manifest_of(package)["engines"], strict=True):
        carried = check_context_model(Path(item["model"]), engine, "TensorrtExecutionProvider")
        assert hashlib.sha256(carried).hexdigest() == engine["sha256"]


def test_onnx_runtime_here_has_no_provider_for_the_context_node(built: Path, tmp_path: Path) -> None:
    """What cannot be tested here, shown rather than assumed: the CPU build of ONNX Runtime refuses the EPContext node
    (running it needs the NV TensorRT RTX provider and a GPU)."""
    ort = pytest.importorskip("onnxruntime")
    assert trtflow(built, "export", "ort-context", str(built / PACKAGE), "--dest", str(tmp_path)).code == 0
    if "NvTensorRTRTXExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has the NV TensorRT RTX provider: the model can run here")
    with pytest.raises(Exception, match="EPContext"):
        ort.InferenceSession(str(next(tmp_path.glob("*_ctx.onnx"))), providers=["CPUExecutionProvider"])


def test_ort_context_refuses_a_tampered_engine_and_writes_no_model(built: Path, tmp_path: Path) -> None:
    package = Path(shutil.copytree(built / PACKAGE, tmp_path / "tiny"))
    engine = package / manifest_of(package)["engines"][0]["file"]
    engine.chmod(0o644)
    engine.write_bytes(engine.read_bytes()[:-1] + b"\0")
    result = trtflow(built, "export", "ort-context", str(package), "--dest", str(tmp_path / "ctx"))
    assert result.code == 3 and "does not match the manifest's" in result.err
    assert not list((tmp_path / "ctx").glob("*_ctx.onnx"))


# Triton ------------------------------------------------------------------------------------


def triton_config(path: Path):
    """config.pbtxt parsed with Triton's own schema (tritonclient's model_config_pb2)."""
    from google.protobuf import text_format

    pb = pytest.importorskip(
        "tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]: pip install 'trtflow[triton]'"
    )
    return text_format.Parse(path.read_text(), pb.ModelConfig()), pb


def export_triton(built: Path, *args: str):
    return trtflow(built, "export", "triton", *args)


def test_a_triton_model_serves_each_gpu_its_own_plan_from_two_packages(built: Path, tmp_path: Path) -> None:
    """Two packages built on different machines (a T4 and an A10) become one model with a plan per compute
    capability."""
    t4 = full_tensorrt_package(built / PACKAGE, tmp_path / "t4" / "tiny", {"t4": "sm_75"})
    a10 = full_tensorrt_package(built / PACKAGE, tmp_path / "a10" / "tiny", {"a10": "sm_86", "l4": "sm_89"})
    result = export_triton(built, str(t4), str(a10), "--repo", str(tmp_path / "repo"), "--version", "3")
    assert result.code == 0, result.err
    config, pb = triton_config(tmp_path / "repo" / "tiny" / "config.pbtxt")
    engines = manifest_of(t4)["engines"][:1] + manifest_of(a10)["engines"]
    tensors = engines[0]["tensors"]
    batch = min(max(p["max"][0] for p in t["profiles"]) for t in tensors if t["mode"] == "input")
    assert (config.name, config.platform, config.max_batch_size) == ("tiny", "tensorrt_plan", batch) and batch == 8
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [
        (t["name"], "TYPE_FP32", t["shape"][1:]) for t in tensors if t["mode"] == "input"
    ]
    assert [(o.name, pb.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == [
        (t["name"], "TYPE_FP32", t["shape"][1:]) for t in tensors if t["mode"] == "output"
    ]
    assert dict(config.cc_model_filenames) == {"7.5": "t4.plan", "8.6": "a10.plan", "8.9": "l4.plan"}
    assert [(g.kind, g.count, list(g.profile)) for g in config.instance_group] == [
        (pb.ModelInstanceGroup.KIND_GPU, 1, ["0"])
    ]
    version = tmp_path / "repo" / "tiny" / "3"
    assert sorted(p.name for p in version.iterdir()) == ["a10.plan", "l4.plan", "t4.plan"]
    for engine in engines:
        assert hashlib.sha256((version / f"{engine['target']}.plan").read_bytes()).hexdigest() == engine["sha256"]


def with_profiles(*batches: tuple[int, int, int]):
    """A manifest edit: every input gets one profile per (min, opt, max) batch size; outputs keep theirs."""

    def edit(engine: dict) -> dict:
        for tensor in engine["tensors"]:
            if tensor["mode"] == "input":
                rest = tensor["shape"][1:]
                tensor["profiles"] = [
                    {"min": [lo, *rest], "opt": [mid, *rest], "max": [hi, *rest]} for lo, mid, hi in batches
                ]
        return engine

    return edit


def covered_batches(manifest: dict) -> set[int]:
    """The batch sizes some profile of every input accepts (per profile: the intersection over inputs)."""
    inputs = [t for t in manifest["engines"][0]["tensors"] if t["mode"] == "input"]
    return {
        b
        for i in range(len(inputs[0]["profiles"]))
        for b in range(
            max(t["profiles"][i]["min"][0] for t in inputs), min(t["profiles"][i]["max"][0] for t in inputs) + 1
        )
    }


def test_each_optimization_profile_gets_an_instance_group_and_batching_follows_the_profiles(
    built: Path, tmp_path: Path
) -> None:
    """(Issue 29: profiles 1-8 and 16-64 gave max_batch_size 64, though batches 9-15 fit no profile.)"""
    two = full_tensorrt_package(
        built / PACKAGE, tmp_path / "two" / "tiny", {"a10": "sm_86"}, with_profiles((1, 4, 8), (9, 32, 64))
    )
    assert export_triton(built, str(two), "--repo", str(tmp_path / "repo"), "--model-name", "two").code == 0
    config, _ = triton_config(tmp_path / "repo" / "two" / "config.pbtxt")
    assert [list(g.profile) for g in config.instance_group] == [["0"], ["1"]] and config.max_batch_size == 64
    # every batch Triton may send fits a profile
    assert covered_batches(manifest_of(two)) >= set(range(1, config.max_batch_size + 1))

    gap = full_tensorrt_package(
        built / PACKAGE, tmp_path / "gap" / "tiny", {"a10": "sm_86"}, with_profiles((1, 4, 8), (16, 32, 64))
    )
    result = export_triton(built, str(gap), "--repo", str(tmp_path / "repo"), "--model-name", "gap")
    assert (
        result.code == 0
        and "max_batch_size 0 (dims are full shapes): the profiles accept batches up to 64 but not 9" in result.err
    )
    config, _ = triton_config(tmp_path / "repo" / "gap" / "config.pbtxt")
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [-1, 3, 32, 32]
    assert [list(g.profile) for g in config.instance_group] == [["0"], ["1"]]

    def static(engine: dict) -> dict:  # no dynamic batch dimension: Triton must not batch, dims are the full shapes
        for tensor in engine["tensors"]:
            tensor["shape"] = [4 if d == -1 else d for d in tensor["shape"]]
            tensor["profiles"] = []
        return engine

    fixed = full_tensorrt_package(built / PACKAGE, tmp_path / "fixed" / "tiny", {"a10": "sm_86"}, static)
    assert export_triton(built, str(fixed), "--repo", str(tmp_path / "repo"), "--model-name", "fixed").code == 0
    config, _ = triton_config(tmp_path / "repo" / "fixed" / "config.pbtxt")
    assert (
        config.max_batch_size == 0
        and list(config.input[0].dims) == [4, 3, 32, 32]
        and [list(g.profile) for g in config.instance_group] == [[]]
    )


def test_an_ampere_plus_plan_is_the_default_for_gpus_without_their_own(built: Path, tmp_path: Path) -> None:
    portable = full_tensorrt_package(
        built / PACKAGE,
        tmp_path / "p" / "tiny",
        {"turing": "sm_75", "any-ampere": "sm_80"},
        lambda e: dict(e, hardware_compatibility="ampere_plus") if e["target"] == "any-ampere" else e,
    )
    assert export_triton(built, str(portable), "--repo", str(tmp_path / "repo")).code == 0
    config, _ = triton_config(tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert (
        dict(config.cc_model_filenames) == {"7.5": "turing.plan"} and config.default_model_filename == "any-ampere.plan"
    )


def test_without_a_hardware_compatible_plan_there_is_no_default(built: Path, tmp_path: Path) -> None:
    """(Issue 29: the default was an architecture-specific plan, loaded by a GPU missing from cc_model_filenames.)"""
    exact = full_tensorrt_package(built / PACKAGE, tmp_path / "e" / "tiny", {"turing": "sm_75", "ampere": "sm_86"})
    result = export_triton(built, str(exact), "--repo", str(tmp_path / "repo"))
    assert result.code == 0 and "no default_model_filename" in result.err
    config, _ = triton_config(tmp_path / "repo" / "tiny" / "config.pbtxt")
    assert (
        dict(config.cc_model_filenames) == {"7.5": "turing.plan", "8.6": "ampere.plan"}
        and config.default_model_filename == ""
    )
    assert "default_model_filename" not in (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()


def test_tensorrt_rtx_engines_are_refused_for_triton_with_the_reason(built: Path, tmp_path: Path) -> None:
    result = export_triton(built, str(built / PACKAGE), "--repo", str(tmp_path / "repo"))
    assert result.code == 3 and result.err.count("\n") == 1
    assert "2 TensorRT-RTX engine(s) and no full TensorRT engine" in result.err and "export ort-context" in result.err
    assert not (tmp_path / "repo").exists()
    full = full_tensorrt_package(built / PACKAGE, tmp_path / "full" / "tiny", {"a10": "sm_86"})
    mixed = export_triton(built, str(full), str(built / PACKAGE), "--repo", str(tmp_path / "repo"))
    # the RTX engines, named; the TensorRT one exported
    assert mixed.code == 0 and mixed.err.count("note: left out") == 2


def test_triton_export_refuses_what_one_model_cannot_serve(built: Path, tmp_path: Path) -> None:
    fp16 = full_tensorrt_package(
        built / PACKAGE,
        tmp_path / "a" / "tiny",
        {"a10": "sm_86", "l4": "sm_89"},
        lambda e: dict(e, precision="fp16") if e["target"] == "l4" else e,
    )
    several = export_triton(built, str(fp16), "--repo", str(tmp_path / "repo"))
    assert several.code == 3 and "several precisions (fp16, fp32)" in several.err and "--precision" in several.err
    assert export_triton(built, str(fp16), "--repo", str(tmp_path / "repo"), "--precision", "fp16").code == 0
    same_gpu = full_tensorrt_package(built / PACKAGE, tmp_path / "b" / "tiny", {"a10": "sm_86", "a10g": "sm_86"})
    twice = export_triton(built, str(same_gpu), "--repo", str(tmp_path / "repo2"))
    assert twice.code == 3 and "compute capability sm_86 has two engines" in twice.err
    other_io = full_tensorrt_package(
        built / PACKAGE,
        tmp_path / "c" / "tiny",
        {"t4": "sm_75"},
        lambda e: dict(e, tensors=[dict(t, name="pixels") if t["mode"] == "input" else t for t in e["tensors"]]),
    )
    a10 = full_tensorrt_package(built / PACKAGE, tmp_path / "d" / "tiny", {"a10": "sm_86"})
    differ = export_triton(built, str(a10), str(other_io), "--repo", str(tmp_path / "repo3"))
    assert differ.code == 3 and "I/O tensors or profiles differ" in differ.err
    assert not (tmp_path / "repo2").exists() and not (tmp_path / "repo3").exists()


def test_a_tampered_plan_leaves_the_repository_as_it_was(built: Path, tmp_path: Path) -> None:
    good = full_tensorrt_package(built / PACKAGE, tmp_path / "good" / "tiny", {"a10": "sm_86"})
    assert export_triton(built, str(good), "--repo", str(tmp_path / "repo")).code == 0
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "repo").rglob("*") if p.is_file()}
    bad = full_tensorrt_package(built / PACKAGE, tmp_path / "bad" / "tiny", {"a10": "sm_86"})
    plan = bad / manifest_of(bad)["engines"][0]["file"]
    plan.chmod(0o644)
    plan.write_bytes(b"\0" + plan.read_bytes()[1:])
    result = export_triton(built, str(bad), "--repo", str(tmp_path / "repo"))
    assert result.code == 3 and "does not match the manifest's" in result.err
    assert {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "repo").rglob("*") if p.is_file()} == before


# publish and provision from a remote ------------------------------------------------------------


def test_provision_from_s3_fetches_the_channel_the_manifest_and_the_chosen_engine_only(
    built: Path, s3, tmp_path: Path
) -> None:
    """(Issue 29: the remote is content-addressed; before, the same test read manifest.json and engines/<target>/...)"""
    package, url = built / PACKAGE, f"s3://{s3.bucket()}/fleet/tiny"
    published = cli("publish", str(package), url, "--json", env=s3.env())
    assert published.returncode == 0, published.stderr
    manifest = manifest_of(package)
    summary = json.loads(published.stdout)
    assert sorted(summary["engines_sent"]) == sorted(e["file"] for e in manifest["engines"])
    ada = next(e for e in manifest["engines"] if e["target"] == "rtx-ada")
    manifest_size = (package / "manifest.json").stat().st_size
    version = summary["version"]
    assert version == hashlib.sha256((package / "manifest.json").read_bytes()).hexdigest()

    s3.reset()
    result = cli("provision", url, "--gpu", "sm_89", "--dest", str(tmp_path / "dest"), "--json", env=s3.env())
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    prefix = f"/{url.removeprefix('s3://')}"
    channel = s3.served[f"{prefix}/channels/stable.json"]
    # nothing else
    assert dict(s3.served) == {
        f"{prefix}/channels/stable.json": channel,
        f"{prefix}/versions/{version}/manifest.json": manifest_size,
        f"{prefix}/engines/{ada['sha256']}.engine": ada["size"],
    }
    assert channel < 300 and record["transfer"]["bytes"] == channel + manifest_size + ada["size"] == sum(
        s3.served.values()
    )
    installed = tmp_path / "dest" / "tiny" / "current" / "tiny.engine"
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == ada["sha256"] and record["action"] == "installed"
    assert record["version"] == version and record["channel"] == "stable"

    s3.reset()
    again = cli("provision", url, "--gpu", "sm_89", "--dest", str(tmp_path / "dest"), "--json", env=s3.env())
    assert again.returncode == 0 and json.loads(again.stdout)["action"] == "unchanged"
    # one conditional GET, answered 304
    assert dict(s3.served) == {} and s3.requests == [("GET", f"{prefix}/channels/stable.json")]

    s3.reset()
    republished = cli("publish", str(package), url, "--json", env=s3.env())
    assert json.loads(republished.stdout)["engines_sent"] == []  # engines/<sha256>.engine are there already
    assert not [path for method, path in s3.requests if method == "PUT" and path.endswith(".engine")]


def test_a_file_remote_holding_only_the_needed_engine_is_enough(built: Path, tmp_path: Path) -> None:
    remote = tmp_path / "share" / "tiny"
    assert cli("publish", str(built / PACKAGE), remote.as_uri()).returncode == 0
    for engine in manifest_of(built / PACKAGE)["engines"]:
        if engine["target"] != "rtx-ampere":
            (remote / "engines" / f"{engine['sha256']}.engine").unlink()
    result = cli("provision", remote.as_uri(), "--gpu", "sm_86", "--dest", str(tmp_path / "dest"))
    assert result.returncode == 0, result.stderr
    assert "fetched" in result.stdout and (tmp_path / "dest" / "tiny" / "current" / "tiny.engine").is_file()
    missing = cli("provision", remote.as_uri(), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert missing.returncode == 3 and "the engine file is missing" in missing.stderr


def test_a_tampered_remote_engine_is_refused_and_nothing_is_installed(built: Path, tmp_path: Path) -> None:
    remote = tmp_path / "share" / "tiny"
    assert cli("publish", str(built / PACKAGE), remote.as_uri()).returncode == 0
    sha = next(e for e in manifest_of(built / PACKAGE)["engines"] if e["target"] == "rtx-ada")["sha256"]
    engine = remote / "engines" / f"{sha}.engine"
    engine.write_bytes(engine.read_bytes()[:-1] + b"\x01")
    result = cli("provision", remote.as_uri(), "--gpu", "sm_89", "--dest", str(tmp_path / "dest"))
    assert (
        result.returncode == 3
        and f"{remote.as_uri()}/engines/{sha}.engine" in result.stderr
        and "does not match" in result.stderr
    )
    assert not (tmp_path / "dest").exists()


def test_remote_failures_are_one_line_with_the_right_exit_code(built: Path, tmp_path: Path) -> None:
    nothing = cli("provision", (tmp_path / "nowhere").as_uri(), "--gpu", "sm_89", "--dest", str(tmp_path / "d"))
    assert (
        nothing.returncode == 3
        and nothing.stderr.count("\n") == 1
        and "manifest.json: not found; publish the package" in nothing.stderr
    )
    env = {
        **subprocess.os.environ,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    down = cli("provision", "s3://bucket/tiny", "--gpu", "sm_89", "--dest", str(tmp_path / "d"), env=env)
    assert (
        down.returncode == 4
        and down.stderr.count("\n") == 1
        and "s3://bucket/tiny/channels/stable.json: cannot read" in down.stderr
    )
    packed = tmp_path / "tiny.tar.gz"
    write_reproducible_tar(built / "artifacts/packages/tiny", packed, "tiny")
    archive = cli("publish", str(packed), (tmp_path / "r").as_uri())
    assert archive.returncode == 3 and "not its archive" in archive.stderr
    assert not (tmp_path / "d").exists() and not (tmp_path / "r").exists()
