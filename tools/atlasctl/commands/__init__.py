"""One module per `atlasctl` subcommand.

Each module exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable ``(args) -> int`` (an exit code from ``atlasctl.exitcodes``).
Modules are discovered, so adding a subcommand is adding a file.
"""

import pkgutil


def command_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
