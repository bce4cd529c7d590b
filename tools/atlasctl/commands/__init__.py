"""One module per `atlasctl` subcommand.

Each module exposes ``register(subparsers)`` which adds its parser and sets
``func`` to a callable ``(args) -> int`` (an exit code from ``atlasctl.exitcodes``).
"""

COMMANDS = ("lab", "bundle", "models", "health")
