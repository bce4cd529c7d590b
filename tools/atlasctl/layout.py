"""The node layout, read from its one definition: ``roles/layout/defaults/main.yml``.

The roles get these names as role defaults (every role that needs them depends on
``roles/layout``); doctor and ``atlasctl config`` resolve the same file here, with the host's
inventory variables on top, so an inventory that moves ``serving_config_dir`` or ``models_root``
moves every stage and every tool together.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2
import yaml

from atlasctl.paths import suite_root

# References are resolved in rounds; the file nests a few levels deep at most.
_ROUNDS = 8


def layout_file() -> Path:
    return suite_root() / "roles/layout/defaults/main.yml"


@functools.cache
def _defaults() -> dict[str, Any]:
    return yaml.safe_load(layout_file().read_text(encoding="utf-8")) or {}


def defaults() -> dict[str, Any]:
    """The layout's variables as written (``{{ }}`` references unresolved)."""
    return dict(_defaults())


def resolve(hostvars: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The layout's variables for a host: its inventory variables override the defaults, and every
    ``{{ }}`` reference is resolved against both (as Ansible would). A value that needs a variable
    neither defines (``models_home`` without ``models_name``) stays unresolved."""
    given = dict(hostvars or {})
    base = _defaults()
    values = {**base, **{k: v for k, v in given.items() if k in base}}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    for _ in range(_ROUNDS):
        pending = {k: v for k, v in values.items() if isinstance(v, str) and "{{" in v}
        if not pending:
            break
        context = {**given, **values}
        for key, text in pending.items():
            try:
                values[key] = env.from_string(text).render(context)
            except jinja2.UndefinedError:
                continue
    return values


@dataclasses.dataclass(frozen=True)
class Layout:
    """The paths doctor reads on a node."""

    service: str
    config_dir: str
    release_dir: str
    record: str
    env_file: str
    args_file: str
    models_root: str
    stamp_dir: str
    engines_root: str
    bundle_record: str  # the bundle the node accepted last (downgrade protection; bundle push reads it)

    @classmethod
    def of(cls, hostvars: Mapping[str, Any] | None = None) -> Layout:
        v = resolve(hostvars)
        return cls(service=v["serving_service_name"], config_dir=v["serving_config_dir"],
                   release_dir=v["serving_release_dir"], record=v["serving_record"],
                   env_file=v["serving_env_file"], args_file=v["serving_args_file"],
                   models_root=v["models_root"], stamp_dir=v["models_stamp_dir"],
                   engines_root=v["engines_root"], bundle_record=v["atlas_bundle_record"])

    def suite_paths(self) -> tuple[str, ...]:
        """The directories the suite keeps on a node (what a bundle push must never land on or above)."""
        return (self.config_dir, self.release_dir, self.models_root, self.stamp_dir, self.engines_root,
                str(PurePosixPath(self.bundle_record).parent))


@functools.cache
def default_layout() -> Layout:
    """The layout of a host whose inventory overrides nothing (read when first needed, not at import)."""
    return Layout.of()
