"""Read the files a user hands to atlasctl; anything unusable is one UsageError naming the file and the problem.

Every command reads its input files through here (text, YAML), so a missing file, a directory, a file
that is not UTF-8, YAML that does not parse or nests without end is the same one line everywhere:
``<what> <path>: <problem>`` with a fix, exit code 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from ansible_collections.atlas.serving.plugins.module_utils import names as _NAMES

from atlasctl.errors import UsageError


def shown(value: object) -> str:
    """``value`` for a one-line message: as it is when every character prints, else escaped as ``repr`` does
    (a newline or an escape sequence in a name never breaks the line or the terminal)."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def read_bytes(path: Path | str, what: str, fix: str | None = None) -> bytes:
    """The bytes of ``path``, read once; ``what`` names the input in the message (e.g. ``--argv-file``)."""
    name = shown(path)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {name} does not exist", fix=fix) from None
    except IsADirectoryError:
        raise UsageError(f"{what} {name} is a directory, not a file", fix=fix) from None
    except OSError as exc:
        raise UsageError(f"{what} {name}: cannot read it: {exc.strerror or exc}", fix=fix) from None


def read_text(path: Path | str, what: str, fix: str | None = None) -> str:
    """The UTF-8 text of ``path``; ``what`` names the input in the message (e.g. ``--argv-file``)."""
    data = read_bytes(path, what, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {shown(path)}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                         f"{exc.start})", fix=fix or "save the file as UTF-8") from None


def parse_yaml(text: str, where: str, fix: str | None = None, *,
               load: Callable[[str], object] = yaml.safe_load) -> object:
    """``yaml.safe_load`` (or ``load``, e.g. :func:`compose_yaml`) with its errors as one line (``where`` names
    the input)."""
    try:
        return load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        place = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise UsageError(f"{where}: not valid YAML: {place}{exc.problem or exc.context}", fix=fix) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{where}: not valid YAML: {' '.join(str(exc).split())}", fix=fix) from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to be a configuration file", fix=fix) from None
    except ValueError as exc:  # a value PyYAML cannot build: a 5000-digit number, a date such as 2024-13-45
        raise UsageError(f"{where}: a value YAML cannot read: {str(exc).split(';')[0]} (quote it if it is text)",
                         fix=fix) from None


def load_yaml(path: Path | str, what: str, fix: str | None = None) -> object:
    """The YAML document in ``path`` (``None`` when it is empty)."""
    return parse_yaml(read_text(path, what, fix), f"{what} {shown(path)}", fix)



def compose_yaml(text: str) -> object:
    """The YAML syntax of ``text`` checked, nothing built: Ansible's own tags (``!vault``, ``!unsafe``) pass."""
    return yaml.compose(text, Loader=yaml.SafeLoader)


def whole_number(value: object, what: str, low: int, high: int, fix: str | None = None) -> int:
    """``value`` when it is a whole number from ``low`` to ``high``; else one UsageError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{what} {value!r}: must be a whole number from {low} to {high}", fix=fix)
    return value


def name(value: object, kind: str, what: str) -> str:
    """``value`` when it is a name of ``kind`` (module_utils/names.py: host, model, bundle, release, profile,
    branch, engine, file); else one UsageError naming ``what`` (the option or field), the value escaped and
    the grammar as the fix (exit code 2)."""
    try:
        return _NAMES.check(value, kind, what)
    except _NAMES.BadName as exc:
        raise UsageError(str(exc), fix=exc.rule) from None


def plain_text(value: str, what: str, fix: str) -> str:
    """``value`` (a path, an option's text) when it holds no control or format character and no template
    delimiter (module_utils/names.py ``unsafe_text``); else one UsageError naming ``what``."""
    unsafe = _NAMES.unsafe_text(value)
    if unsafe:
        raise UsageError(f"{what} {_NAMES.shown(value)}: {unsafe}", fix=fix)
    return value
