"""What a bundle's build steps are made of, below both the build (atlasctl.bundle) and the sources that plan
steps for it (atlasctl.bundle_sources, and the lab's by entry point): a step, and the checks of a tree a step
copies (regular files only, none a hard link to a file outside it). Imports go one way: bundle ->
bundle_sources -> bundle_step; bundle -> bundle_step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import checksums as _CHECKSUMS

from atlasctl.errors import UsageError

Step = Callable[[Path], None]


@dataclasses.dataclass(frozen=True)
class PlannedStep:
    """One build step: what it is, the function that writes into the bundle directory, the source its files
    are recorded with in the manifest, the patterns (fnmatch, relative to the bundle) of the files it owns, and
    fields its files' manifest entries carry beyond the common ones ({path: {field: value}}: an image's
    variant, cann and engine_release)."""
    title: str
    run: Step
    source: str
    owns: tuple[str, ...]
    fields: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


def scan_tree(root: Path) -> tuple[list[str], list[str]]:
    """(regular files, symlinks and special files) under root, nothing followed: module_utils/checksums."""
    return _CHECKSUMS.scan_tree(str(root))


def some_paths(rels: list[str]) -> str:
    """The first ten of ``rels``, and how many more."""
    return ", ".join(rels[:10]) + (f" and {len(rels) - 10} more" if len(rels) > 10 else "")


def check_no_foreign_links(root: Path, files: list[str], what: str) -> None:
    """Refuse a hard link among ``files`` (every regular file under root) to a file with a name outside root
    (module_utils/checksums ``foreign_links``): a bundle, and a model it copies, hold their own files."""
    foreign = _CHECKSUMS.foreign_links(str(root), files)
    if foreign:
        raise UsageError(f"{what}: a hard link to a file outside it (another name of the same file is elsewhere): "
                         f"{some_paths(foreign)}", fix="give it its own copy of each (cp without -l/--link, rsync "
                         "without -H), or remove them")
