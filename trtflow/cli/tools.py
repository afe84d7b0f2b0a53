"""`trtflow export`, `keygen`, `toolchain`, `doctor` and `cache`: the commands about packages' other forms, keys, the
locked toolchain and the store (commands.py holds the pipeline's own commands and `main`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtflow.cli import output
from trtflow.cli.app import Context, cli, pass_context
from trtflow.services import housekeeping, provisioning


@cli.group()
def export() -> None:
    """Turn packages into what a serving runtime loads: ONNX Runtime EP-context models, a Triton model repository."""


@export.command("ort-context")
@click.argument("package", metavar="PACKAGE|URL")
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for <recipe>-<target>-<precision>_ctx.onnx and its engine.",
)
@click.option(
    "--embed", is_flag=True, help="Put the engine bytes inside the model (embed_mode 1) instead of beside it."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export_ort_context(package: str, dest: Path, embed: bool, as_json: bool) -> None:
    """Write one ONNX model per engine whose EPContext node ONNX Runtime's TensorRT(-RTX) provider loads without
    compiling."""
    written = provisioning.export_ort_context(package, dest, embed)
    if as_json:
        click.echo(json.dumps(written, indent=2))
        return
    for item in written:
        beside = f" + {Path(item['engine']).name}" if item["engine"] else " (engine embedded)"
        click.echo(f"wrote {item['model']}{beside}: {item['precision']} for {item['target']}, {item['source']}")


@export.command("triton")
@click.argument("packages", nargs=-1, required=True, metavar="PACKAGE|URL...")
@click.option(
    "--repo",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The Triton model repository folder.",
)
@click.option("--model-name", help="The Triton model's name (default: the recipe).")
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The model version folder to write.",
)
@click.option("--precision", help="The precision to serve, when the packages hold several.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export_triton(
    packages: tuple[str, ...],
    repo: Path,
    model_name: str | None,
    version: int,
    precision: str | None,
    as_json: bool,
) -> None:
    """Write a Triton model (config.pbtxt + <version>/<target>.plan) serving full TensorRT engines on every GPU they
    were built for."""
    written = provisioning.export_triton(packages, repo, model_name, version, precision)
    if as_json:
        click.echo(json.dumps(written, indent=2))
        return
    for note in written["notes"]:
        click.echo(f"note: {note}", err=True)
    ccs = ", ".join(f"{cc} -> {file}" for cc, file in written["cc_model_filenames"].items())
    click.echo(
        f"wrote {written['config']} and version {written['version']}: max_batch_size {written['max_batch_size']}, "
        f"cc_model_filenames {ccs or 'none'}, default {written['default_model_filename']}"
    )


@cli.command()
@click.argument("stem", type=click.Path(path_type=Path))
def keygen(stem: Path) -> None:
    """Make an Ed25519 key pair STEM.key (private, mode 0600: give it to CI as TRTFLOW_SIGNING_KEY_FILE) and
    STEM.pub."""
    from trtflow.signing import KEY_FILE_ENV, generate_key_pair

    private, public, keyid = generate_key_pair(stem)
    click.echo(f"wrote {private} (private: keep it out of the repository; sign with {KEY_FILE_ENV}={private})")
    click.echo(f"wrote {public} (public, key id {keyid[:16]}: list it under cache.trust, pass it to provision --trust)")


@cli.command()
@pass_context
def toolchain(ctx: Context) -> None:
    """Print the exact tool versions trtflow.lock's stage keys name, as a pip requirements file.

    A release build from an old tag installs them so `run --frozen` rebuilds what was locked:
    `trtflow toolchain > toolchain.txt && pip install -r toolchain.txt`."""
    click.echo(housekeeping.toolchain_requirements(ctx.project_dir), nl=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def doctor(ctx: Context, as_json: bool) -> None:
    """Hold the installed tools to the ones trtflow.lock was made with; exit 1 naming each that differs."""
    report = housekeeping.doctor(ctx.project_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        output.print_doctor(report["tools"], report["trtflow"], report["hint"])
    if not report["ok"]:
        sys.exit(1)


@cli.group()
def cache() -> None:
    """The store: what it holds (ls), whether its objects are intact (verify), what can be deleted (gc)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_ls(ctx: Context, as_json: bool) -> None:
    """Records and bytes per recipe and stage, how many of them trtflow.lock uses, and store totals."""
    info = _report(housekeeping.cache_usage(ctx.project_dir), as_json)
    if info is None:
        return
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{'recipe':<24} {'stage':<10} {'records':>7} {'in lock':>7} {'size':>10}")
    for row in info["stages"]:
        click.echo(
            f"{row['recipe']:<24} {row['stage']:<10} {row['records']:>7} {row['in_lock']:>7} "
            f"{output.size(row['bytes']):>10}"
        )
    objects, loose = info["objects"], info["unreferenced"]
    click.echo(
        f"objects: {objects['count']} ({output.size(objects['bytes'])}); used by no record: {loose['count']} "
        f"({output.size(loose['bytes'])}); "
        f"quarantined: {output.size(info['corrupt'])}; work dirs: {output.size(info['tmp'])}  [{info['store']}]"
    )


@cache.command("verify")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_verify(ctx: Context, as_json: bool) -> None:
    """Re-hash every object and check every record; name bad ones (exit 1) and move them aside so the next run rebuilds
    them."""
    report = _report(housekeeping.cache_verify(ctx.project_dir), as_json)
    if report is None:
        return
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        output.print_verify(report)
    if report["corrupt"] or report["set_aside"]:
        sys.exit(1)


@cache.command("gc")
@click.option(
    "--keep-last", type=click.IntRange(min=0), default=0, show_default=True, help="Also keep what the last N runs used."
)
@click.option("--yes", is_flag=True, help="Delete (without it, only say what would be deleted).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cache_gc(ctx: Context, keep_last: int, yes: bool, as_json: bool) -> None:
    """Delete what trtflow.lock, the current packages (and --keep-last N runs) do not use. A dry run without --yes."""
    report = _report(housekeeping.cache_gc(ctx.project_dir, keep_last, yes), as_json)
    if report is None:
        return
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    verb = "deleted" if yes else "would delete"
    freed = report["freed"]
    click.echo(
        f"{verb} {len(report['records'])} records, {len(report['objects'])} objects ({output.size(freed['objects'])}), "
        f"{output.size(freed['corrupt'])} quarantined, {output.size(freed['tmp'])} of dead runs' work dirs and "
        f"leftovers: {output.size(report['freed_bytes'])} in all"
    )
    kept = "trtflow.lock and the packages use" + (f", and the last {keep_last} run(s) used" if keep_last else "")
    click.echo(
        f"kept {report['kept_records']} records, {report['kept_objects']} objects "
        f"({output.size(report['kept_bytes'])}): what {kept}"
    )
    if not yes:
        click.echo("dry run: pass --yes to delete")


def _report(answer: housekeeping.StoreAnswer, as_json: bool) -> dict | None:
    """A cache command's report, after its notes; None (said to the user) if nothing has run yet."""
    if answer.report is None:
        _no_store(answer.store, as_json)
        return None
    output.print_warnings(list(answer.notes))
    return answer.report


def _no_store(path: Path, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"store": str(path), "exists": False}))
    else:
        click.echo(f"no store at {path} yet (nothing has run): nothing to do")
