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
import jinja2.sandbox
import yaml

from atlasctl.errors import UsageError
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
    neither defines (``models_home`` without ``models_name``) stays unresolved; one that is not a template
    Jinja can read is a UsageError naming the variable."""
    given = dict(hostvars or {})
    base = _defaults()
    values = {**base, **{k: v for k, v in given.items() if k in base}}
    # Sandboxed: the values are the inventory's, and a template reaches no Python internals (jinja2.sandbox).
    env = jinja2.sandbox.SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
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
            except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, RecursionError) as exc:
                raise UsageError(f"{key} {text!r} is not a template that renders: {exc}",
                                 fix=f"set {key} to an absolute path") from None
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
        for key in _FIELDS.values():
            if not isinstance(v[key], str) or not v[key] or not v[key].isprintable():
                raise UsageError(f"{key} {v[key]!r} is not a path or a name",
                                 fix=f"set {key} to plain text (roles/layout/defaults/main.yml has the default)")
        return cls(**{field: v[key] for field, key in _FIELDS.items()})

    def suite_paths(self) -> tuple[str, ...]:
        """The directories the suite keeps on a node (what a bundle push must never land on or above)."""
        return (self.config_dir, self.release_dir, self.models_root, self.stamp_dir, self.engines_root,
                str(PurePosixPath(self.bundle_record).parent))


# Layout's fields and the layout variables they come from.
_FIELDS = {"service": "serving_service_name", "config_dir": "serving_config_dir", "release_dir": "serving_release_dir",
           "record": "serving_record", "env_file": "serving_env_file", "args_file": "serving_args_file",
           "models_root": "models_root", "stamp_dir": "models_stamp_dir", "engines_root": "engines_root",
           "bundle_record": "atlas_bundle_record"}


@functools.cache
def default_layout() -> Layout:
    """The layout of a host whose inventory overrides nothing (read when first needed, not at import)."""
    return Layout.of()
