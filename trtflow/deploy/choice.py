"""Which engine of a package fits a device, and why every other does not: the rules `provision` applies.

The choice reads only the manifest, so a fleet agent decides without TensorRT or a GPU. Rules, in order:
1. backend and precision, when asked for;
2. hardware: the GPU's compute capability is listed (exact), or the build is hardware-compatible
   (`ampere_plus`: any sm_80 or newer; `same_compute_capability`: only what it lists);
3. runtime version, only when given: TensorRT needs the build's major.minor.patch, or for a
   version-compatible build (TensorRT 8.6 and newer) a runtime at least as new within the same major, or
   one of the two cross-major pairs TensorRT's support matrix allows (11.4, Engine Portability: "TensorRT
   10 version-compatible engines can run with a TensorRT 11 runtime, and TensorRT 8 version-compatible
   engines can run with a TensorRT 10 runtime. No other combination across major versions is supported").
   TensorRT-RTX needs the same major.minor.patch: its engines "are not compatible between different
   releases" (TensorRT-RTX docs, Engine Compatibility);
4. plugins: every plugin library the engine needs is in --plugin-dir (by sha256) or carried by the package
   (deploy.plugins);
5. verification: an engine whose recorded checks failed (kept with `verify.on_fail: warn`) is never chosen
   unless --allow-failed.
Among fits: the preferred precision (--prefer; default fp8, int8, fp16, bf16, fp32: fewest bits first, since
an engine is in the package only when its precision met the recipe's accuracy limits, the fastest of them is
the one its author accepted), then exact before hardware-compatible, then the newest backend, then manifest order.
`--prefer drop` first ranks by the task accuracy drop the manifest measured on labelled data (lowest first; fp32 is the
baseline, drop 0), then as above.
E.g. sm_89 with rtx-ampere (sm_86) and rtx-ada (sm_89) engines: rtx-ada, "exact compute capability match".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from trtflow.deploy.plugins import PluginDir, missing_plugin
from trtflow.device import no_gpu_reason, query_compute_capabilities
from trtflow.errors import BadRequest, EnvironmentProblem, NoEngineFits
from trtflow.manifest import Engine, Manifest, MissingEngine
from trtflow.util.cc import ComputeCapability

EXACT = "exact compute capability match"
AMPERE_PLUS = "hardware-compatible build (ampere_plus runs on sm_80 and newer)"
DEFAULT_PREFERENCE = ("fp8", "int8", "fp16", "bf16", "fp32")
# A version-compatible engine of one TensorRT major also loads on these runtime majors (support matrix, 11.4).
CROSS_MAJOR_RUNTIMES = {8: (10,), 10: (11,)}


@dataclass(frozen=True)
class Device:
    """What the engine must run on: every compute capability listed, with an optional runtime."""

    compute_capabilities: tuple[str, ...]
    label: str
    source: str
    runtime_version: str | None = None
    backend: str | None = None
    precision: str | None = None
    prefer: tuple[str, ...] = DEFAULT_PREFERENCE
    allow_failed: bool = False
    plugins: PluginDir | None = None  # --plugin-dir: the plugin libraries this device has
    by_drop: bool = False  # --prefer drop: the measured task accuracy drop ranks first


@dataclass(frozen=True)
class Verdict:
    """One engine judged against the device: `fit` names how it fits, else `refusal` why not."""

    engine: Engine
    index: int
    fit: str | None = None
    refusal: str | None = None


def judge(engine: Engine, index: int, device: Device) -> Verdict:
    """The first rule the engine breaks, or how it fits (cheap checks first)."""
    if device.backend and engine.backend != device.backend:
        return Verdict(engine, index, refusal=f"backend {engine.backend}, not the requested {device.backend}")
    if device.precision and engine.precision != device.precision:
        return Verdict(engine, index, refusal=f"precision {engine.precision}, not the requested {device.precision}")
    fits = [_hardware_fit(engine, cc) for cc in device.compute_capabilities]
    refusal = next((reason for fit, reason in fits if fit is None), None) or _runtime_refusal(
        engine, device.runtime_version
    )
    refusal = refusal or missing_plugin(engine, device.plugins)
    refusal = refusal or (None if device.allow_failed else failed_checks(engine))
    if refusal:
        return Verdict(engine, index, refusal=refusal)
    return Verdict(engine, index, fit=EXACT if all(fit == EXACT for fit, _ in fits) else AMPERE_PLUS)


def _hardware_fit(engine: Engine, cc: str) -> tuple[str | None, str]:
    """(how the engine fits `cc`, "") or (None, why it cannot run there)."""
    listed = ", ".join(engine.compute_capabilities)
    if cc in engine.compute_capabilities:
        return EXACT, ""
    if engine.hardware_compatibility == "ampere_plus":
        return (
            (AMPERE_PLUS, "")
            if ComputeCapability.parse(cc) >= "sm_80"
            else (None, f"ampere_plus build needs sm_80 or newer, {cc} is older")
        )
    return None, f"built for {listed} only, not {cc} (hardware_compatibility: {engine.hardware_compatibility})"


def _runtime_refusal(engine: Engine, runtime: str | None) -> str | None:
    """Why `runtime` cannot load the engine, or None (also when no runtime version was given)."""
    if runtime is None:
        return None
    built, wanted = _version(engine.backend_version), _version(runtime)
    if built is None or wanted is None:
        return f"cannot compare backend version {engine.backend_version!r} with runtime {runtime!r}"
    if engine.backend == "tensorrt" and engine.version_compatible and built >= (8, 6, 0):  # the flag exists from 8.6
        return _version_compatible_refusal(engine.backend_version, built, wanted, runtime)
    if wanted == built:
        return None
    return (
        f"{engine.backend} {engine.backend_version} engines load only on the same release "
        f"({'.'.join(map(str, built))}), not runtime {runtime}"
    )


def _version_compatible_refusal(
    shown: str, built: tuple[int, int, int], wanted: tuple[int, int, int], runtime: str
) -> str | None:
    """Why a version-compatible TensorRT engine cannot load on `runtime`, or None (the support matrix's rules)."""
    if (wanted[0] == built[0] and wanted >= built) or wanted[0] in CROSS_MAJOR_RUNTIMES.get(built[0], ()):
        return None
    later = " or ".join(f"{major}.x" for major in CROSS_MAJOR_RUNTIMES.get(built[0], ()))
    return (
        f"version-compatible build from tensorrt {shown} needs a {built[0]}.x runtime at least that new"
        + (f" or a {later} runtime" if later else "")
        + f", not {runtime}"
    )


def failed_checks(engine: Engine) -> str | None:
    """`failed verification: ...` when a check recorded for the engine did not pass, else None."""
    proofs = engine.verification
    if proofs is None:
        return None
    failed = [
        name
        for name, passed in (
            ("cleanup equality", proofs.cleanup_equality.passed),
            ("accuracy vs fp32", proofs.precision_accuracy.passed if proofs.precision_accuracy else None),
            ("engine run", proofs.engine_run.passed),
        )
        if passed is False
    ]
    failed += ["engine I/O checks"] if proofs.engine_checks.get("problems") else []
    return f"failed verification ({', '.join(failed)}); --allow-failed to take it anyway" if failed else None


def _version(text: str) -> tuple[int, int, int] | None:
    """major.minor.patch of '10.13.3.9' or '1.7' (missing parts are 0); None if not a version."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.\d+)?", text.strip())
    if match is None:
        return None
    major, minor, patch = (int(part or 0) for part in match.groups())
    return major, minor, patch


def _rank(verdict: Verdict, device: Device) -> tuple:
    """With --prefer drop the measured drop first; then the preferred precision, exact before hardware-compatible,
    the newest backend, manifest order."""
    version = _version(verdict.engine.backend_version) or (-1, -1, -1)
    prefer, effective = device.prefer, effective_precision(verdict.engine)
    precision = prefer.index(effective) if effective in prefer else len(prefer)
    drop = measured_drop(verdict.engine) if device.by_drop else 0.0
    return (
        drop,
        precision,
        effective != verdict.engine.precision,
        verdict.fit != EXACT,
        tuple(-part for part in version),
        verdict.index,
    )


# a reduced-precision engine with less than this share of its weights or MACs in its precision is ranked as fp32
MOSTLY = 0.5


def effective_precision(engine: Engine) -> str:
    """What an engine really computes in, for ranking: its precision, or fp32 when its composition says most of its
    weights or multiply-accumulates stayed fp32 (an "fp16" engine AutoCast left mostly fp32 is no faster)."""
    composition = getattr(engine.verification, "precision_composition", None)
    shares = [
        share
        for share in (getattr(composition, "weight_share", None), getattr(composition, "mac_share", None))
        if share is not None
    ]
    return "fp32" if engine.precision != "fp32" and shares and min(shares) < MOSTLY else engine.precision


def chosen_because(verdict: Verdict) -> str:
    """Why the chosen engine fits, and what its precision really covers when fallback: auto kept nodes higher:
    `exact compute capability match; int8 with 1 node kept higher by fallback: auto (65% of MACs in int8)`."""
    engine, fit = verdict.engine, verdict.fit or "fits"
    search = engine.verification.precision_fallback if engine.verification else None
    kept = search.get("kept") if isinstance(search, dict) else None
    if not isinstance(kept, list) or not kept:
        return fit
    composition = engine.verification.precision_composition if engine.verification else None
    mac = composition.mac_share if composition is not None else None
    share = f" ({mac:.0%} of MACs in {engine.precision})" if mac is not None else ""
    return f"{fit}; {engine.precision} with {len(kept)} node(s) kept higher by fallback: auto{share}"


def measured_drop(engine: Engine) -> float:
    """The task accuracy drop from fp32 the manifest records (fp32: 0, the baseline); infinity when not measured."""
    if engine.precision == "fp32":
        return 0.0
    accuracy = engine.verification.precision_accuracy if engine.verification else None
    return accuracy.task.drop if accuracy is not None and accuracy.task is not None else float("inf")


def choose(manifest: Manifest, device: Device) -> tuple[Verdict, list[tuple[Verdict, str]]]:
    """The chosen engine and, for every other one, why it was not chosen. Raises NoEngineFits."""
    verdicts = [judge(engine, index, device) for index, engine in enumerate(manifest.engines)]
    fitting = sorted((v for v in verdicts if v.fit), key=lambda v: _rank(v, device))
    if not fitting:
        raise NoEngineFits(_no_fit_message(manifest, device, verdicts))
    chosen = fitting[0]
    others = [(v, v.refusal or _outranked(v, chosen, device)) for v in verdicts if v is not chosen]
    return chosen, others


def _outranked(verdict: Verdict, chosen: Verdict, device: Device) -> str:
    """Why a fitting engine lost to the chosen one, in the order the ranking decides."""
    mine, theirs = _rank(verdict, device), _rank(chosen, device)
    if mine[0] != theirs[0]:
        return (
            f"fits, but {chosen.engine.precision} lost less task accuracy ({theirs[0]:g}) than "
            f"{verdict.engine.precision} "
            f"({mine[0]:g}) (--prefer drop)"
        )
    if mine[1] != theirs[1] or mine[2] != theirs[2]:
        mostly = (
            " (its composition is mostly fp32: ranked as fp32)"
            if effective_precision(verdict.engine) != verdict.engine.precision
            else ""
        )
        return (
            f"fits, but {chosen.engine.precision} is preferred to {verdict.engine.precision}{mostly} (--prefer "
            f"{','.join(device.prefer)})"
        )
    if verdict.fit != chosen.fit:
        return f"fits ({verdict.fit}), but an exact compute capability match is preferred"
    if mine[4] != theirs[4]:
        return (
            f"fits, but {chosen.engine.backend} {chosen.engine.backend_version} is newer than "
            f"{verdict.engine.backend_version}"
        )
    return "fits equally well, but comes later in the manifest"


def _describe(engine: Engine) -> str:
    return (
        f"{engine.file} ({engine.precision}, {engine.backend} {engine.backend_version}, "
        f"{', '.join(engine.compute_capabilities)})"
    )


def _no_fit_message(manifest: Manifest, device: Device, verdicts: list[Verdict]) -> str:
    runtime = f"runtime {device.runtime_version}" if device.runtime_version else "runtime version not checked"
    lines = [f"no engine in package {manifest.recipe} fits {device.label} ({runtime}):"]
    lines += [f"  {_describe(v.engine)}: {v.refusal}" for v in verdicts] or ["  the package holds no engines"]
    failed = failed_for(manifest, device)
    lines += [
        f"  {m.target} {m.precision} ({', '.join(m.compute_capabilities)}): not built, {m.stage} failed: {m.reason}"
        for m in failed
    ]
    if failed:
        targets = ", ".join(dict.fromkeys(m.target for m in failed))
        lines.append(
            f"the engines for {device.label} (target {targets}) failed to build: fix the cause above and run `trtflow "
            "run`, "
            "or provision for another --gpu"
        )
    elif any((v.refusal or "").startswith("needs plugin ") for v in verdicts):
        lines.append(
            "put the plugin library in the folder --plugin-dir names, or package it with the recipe's package: "
            "{plugins: carry}"
        )
    else:
        lines.append(
            f"add a pipeline target that fits {device.label} and run `trtflow run`, or provision for another --gpu / "
            "--runtime-version"
        )
    return "\n".join(lines)


def failed_for(manifest: Manifest, device: Device) -> list[MissingEngine]:
    """The engines the recipe asked for the device's GPU that failed to build (left out of the package), by the
    compute capabilities of their target; those of another precision or backend than asked for are not named."""
    wanted = set(device.compute_capabilities)
    return [
        m for m in manifest.missing if wanted & set(m.compute_capabilities) and device.precision in (None, m.precision)
    ]


def device_from_options(
    gpu: str,
    manifest: Manifest,
    runtime_version: str | None = None,
    backend: str | None = None,
    precision: str | None = None,
    prefer: str | None = None,
    allow_failed: bool = False,
    plugin_dir: Path | None = None,
) -> Device:
    """--gpu auto (nvidia-smi), a compute capability (sm_86, 8.6) or a target name of the package."""
    if runtime_version is not None and _version(runtime_version) is None:
        raise BadRequest(
            f"--runtime-version {runtime_version!r} is not a version: pass it as X.Y.Z, e.g. 10.13.3 or 1.7.1"
        )
    by_drop = _by_drop(prefer, manifest)
    precisions = ",".join(p for p in prefer.split(",") if p.strip() != "drop") if by_drop and prefer else prefer
    device = functools.partial(
        Device,
        runtime_version=runtime_version,
        backend=backend,
        precision=precision,
        by_drop=by_drop,
        prefer=_preference(precisions or None),
        allow_failed=allow_failed,
        plugins=PluginDir(plugin_dir) if plugin_dir is not None else None,
    )
    if gpu == "auto":
        detected = detect_compute_capabilities()
        return device(tuple(detected), "+".join(detected), "auto-detected")
    try:
        cc = ComputeCapability.parse(gpu)
        return device((cc,), cc, "given")
    except ValueError:
        pass
    ccs = sorted(
        {cc for e in manifest.engines if e.target == gpu for cc in e.compute_capabilities}, key=lambda cc: (len(cc), cc)
    )
    if not ccs:
        targets = ", ".join(sorted({e.target for e in manifest.engines})) or "none"
        raise BadRequest(
            f"--gpu {gpu!r} is neither auto, a compute capability (sm_86, 8.6) nor a target of package "
            f"{manifest.recipe} (its targets: {targets})"
        )
    return device(tuple(ccs), f"{gpu} ({', '.join(ccs)})", f"target {gpu} of the manifest")


def _by_drop(prefer: str | None, manifest: Manifest) -> bool:
    """--prefer drop[,fp16,...]: rank by the measured task accuracy drop, which the manifest must record."""
    if prefer is None or "drop" not in {p.strip() for p in prefer.split(",")}:
        return False
    if not any(e.precision != "fp32" and measured_drop(e) != float("inf") for e in manifest.engines):
        raise BadRequest(
            f"--prefer drop: package {manifest.recipe} records no task accuracy drop; its recipe needs "
            "accuracy: {data: <glob>, labels: <file.npy>} and a reduced precision"
        )
    return True


def _preference(text: str | None) -> tuple[str, ...]:
    """--prefer fp16,int8: those first in that order, then the default order for the rest."""
    if text is None:
        return DEFAULT_PREFERENCE
    given = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in given if p not in DEFAULT_PREFERENCE]
    if unknown or not given:
        raise BadRequest(f"--prefer {text!r}: name precisions from {', '.join(DEFAULT_PREFERENCE)}, comma-separated")
    return given + tuple(p for p in DEFAULT_PREFERENCE if p not in given)


def detect_compute_capabilities() -> list[ComputeCapability]:
    """The local GPUs' compute capabilities (an engine must fit all of them); EnvironmentProblem if none."""
    ccs = list(query_compute_capabilities())
    if not ccs:
        raise EnvironmentProblem(
            f"{no_gpu_reason()}; pass --gpu sm_XY (or 8.6, or a target name) for the device to provision"
        )
    return ccs
