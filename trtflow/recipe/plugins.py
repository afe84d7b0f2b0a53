"""Plugin libraries a recipe declares (`build: {plugins: [libs/x.so]}`): checked when the recipe loads, then inputs.

A library is a source of the recipe's build, verify and package stages under the role `plugin:<file name>`: its
digest enters their keys, never its path, so moving it to another folder rebuilds nothing, and changing its bytes
rebuilds exactly the engines of the recipes that declare it (`plan --explain`: `input plugin:libx.so changed`).
Its file name is what the manifest lists and a device finds it by (with its sha256), so names are unique per recipe.

    >>> plugin_sources(item, root)
    (("plugin:libx.so", PosixPath("/proj/libs/libx.so")),)
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.errors import ProjectError

if TYPE_CHECKING:
    from trtflow.recipe.project import RecipeFile


ROLE_PREFIX = "plugin:"
# A plugin's name becomes a file name in packages and on devices: a plain name, never a path.
PLUGIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


def plugin_role(name: str) -> str:
    """The input role of a plugin library: `plugin:libx.so`."""
    return ROLE_PREFIX + name


def plugin_name(role: str) -> str | None:
    """`libx.so` of the role `plugin:libx.so`; None for any other role."""
    return role[len(ROLE_PREFIX) :] if role.startswith(ROLE_PREFIX) else None


def plugin_sources(item: RecipeFile, root: Path) -> tuple[tuple[str, Path], ...]:
    """(role, resolved path) of each library the recipe declares, in its order; ProjectError naming file, line and
    field."""
    sources: list[tuple[str, Path]] = []
    for index, given in enumerate(item.recipe.build.plugins):
        where = item.where("build", "plugins", index)
        path = _checked_path(where, given, root)
        name = Path(given).name
        if not PLUGIN_NAME.match(name):
            raise ProjectError(
                f"{where}: plugin library name {name!r} must be a plain file name ([A-Za-z0-9._+-], at most 100)"
            )
        if any(role == plugin_role(name) for role, _ in sources):
            raise ProjectError(
                f"{where}: another plugin library of this recipe is also named {name}; plugins are found by name on "
                "a device: rename one"
            )
        sources.append((plugin_role(name), path))
    return tuple(sources)


def _checked_path(where: str, given: str, root: Path) -> Path:
    """The library's resolved path: a regular file inside the project, or wherever an absolute path the user wrote
    says."""
    try:
        path = (Path(given) if os.path.isabs(given) else root / given).resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop
        raise ProjectError(f"{where}: cannot follow {given}: {exc}") from exc
    if not os.path.isabs(given) and not path.is_relative_to(root.resolve()):
        raise ProjectError(
            f"{where}: {given} is outside the project; write an absolute path to use a library from elsewhere"
        )
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ProjectError(f"{where}: plugin library not found: {given}") from None
    if not stat.S_ISREG(mode):
        raise ProjectError(
            f"{where}: {given} is not a regular file (a plugin library is a shared library, e.g. libx.so)"
        )
    return path
