"""The `atlasctl` entry point: parse, configure logging once, dispatch, map errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from atlasctl import __version__, exitcodes
from atlasctl.commands import command_names
from atlasctl.errors import AtlasError, EnvironmentProblem


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atlasctl",
        description="Provision, verify, roll out and diagnose LLM serving on Huawei Atlas fleets.",
    )
    parser.add_argument("--version", action="version", version=f"atlasctl {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in command_names():
        importlib.import_module(f"atlasctl.commands.{name}").register(sub)
    return parser


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse, configure logging once, dispatch, map errors to exit codes (atlasctl's and atlas-lab's)."""
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or exitcodes.OK)
    except AtlasError as exc:
        print(f"{parser.prog}: error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return exitcodes.INTERRUPTED


def _no_collection(exc: ModuleNotFoundError) -> EnvironmentProblem:
    """The commands import the atlas.serving collection, which a .pth file puts on the Python path (the wheel's,
    or the one `make venv` writes): without it, one line and the fix instead of a traceback."""
    if not (exc.name or "").startswith("ansible_collections"):
        raise exc
    return EnvironmentProblem(f"{exc.name} is not importable: the atlas.serving collection is not on the Python path",
                              fix="reinstall atlasctl from its wheel (it carries the collection and puts it on the "
                                  "path), or in a checkout run `make venv`")


def main(argv: list[str] | None = None) -> int:
    """The CLI; everything it prints from parsing on goes through outputs.safe_lines (no raw control character
    of a host name, a path or a reply reaches the terminal)."""
    try:
        outputs = importlib.import_module("atlasctl.outputs")  # here: it needs the collection, as the commands do
        parser = build_parser()
    except (AtlasError, ModuleNotFoundError) as exc:
        problem = exc if isinstance(exc, AtlasError) else _no_collection(exc)
        print(f"atlasctl: error: {problem.render()}", file=sys.stderr)
        return problem.exit_code
    with outputs.escaping_streams():
        return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
