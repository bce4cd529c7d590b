# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names a user hands to the suite: one grammar per kind, one check for every entry point.

A name (a host, a model, a bundle, a release, a profile, a branch, a file in a bundle) becomes a path
component, a word on a command line, a label in a message or a value a template is filled with. Every
grammar is a whole-string match (``re.fullmatch``; ``$`` would let a trailing newline through) of
letters, digits and a few punctuation marks, starting with a letter or a digit, with a length limit; on
top of the grammar a name never holds ``..``. So a name never holds a path separator, a control or
format character (Unicode categories Cc, Cf, Zl, Zp: a newline, an escape sequence, U+202E that
reverses the text a terminal shows), a Jinja delimiter (``{{``, ``{%``, ``{#``), a blank, nor starts
with ``-`` (an option) or ``.`` (a hidden file, ``..``).

:func:`problem` says why a value is not a name of a kind ('' when it is); :func:`check` raises
:class:`BadName` whose message names the input (``what``), shows the value escaped (``repr``: every
control character visible, the line never broken) and gives the grammar. :func:`unsafe_text` finds the
characters no text the suite is handed (a path, a name) may hold, for inputs that are not names.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Unicode categories a name or a path never holds: control (Cc), format (Cf: bidi overrides, zero-width
# characters), line and paragraph separators (Zl, Zp).
UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
TEMPLATE_DELIMITERS = ("{{", "}}", "{%", "%}", "{#", "#}")


@dataclass(frozen=True)
class Grammar:
    """One kind of name: its pattern (fullmatch), its longest length, the rule in words and an example."""

    pattern: re.Pattern
    longest: int
    rule: str
    example: str


def _grammar(first: str, rest: str, longest: int, rule: str, example: str) -> Grammar:
    return Grammar(re.compile(f"[{first}][{rest}]{{0,{longest - 1}}}"), longest,
                   f"{rule}, starting with a letter or digit, at most {longest} characters, never '..'", example)


KINDS = {
    "host": _grammar("A-Za-z0-9:", "A-Za-z0-9._:%-", 253, "a host name or address: letters, digits and . _ : % -",
                     "atlas-dc1-01.bank.example or 10.77.0.11"),
    "model": _grammar("A-Za-z0-9", "A-Za-z0-9._+-", 128, "a model name: letters, digits and . _ + -",
                      "qwen2.5-72b-instruct"),
    "bundle": _grammar("A-Za-z0-9", "A-Za-z0-9._+-", 128, "a bundle name: letters, digits and . _ + -",
                       "bank-2026.12.0"),
    "release": _grammar("A-Za-z0-9", "A-Za-z0-9._-", 64, "a release id, one directory name: letters, digits and "
                        ". _ -", "bank-2026.12.0"),
    "profile": _grammar("A-Za-z0-9", "A-Za-z0-9._+-", 128, "a profile name: letters, digits and . _ + -",
                        "vllm-ascend-0.11.0-mistral-7b-8x64g"),
    "branch": _grammar("A-Za-z0-9", "A-Za-z0-9_-", 64, "a branch name: letters, digits and _ -", "branch_east"),
    "engine": _grammar("A-Za-z0-9", "A-Za-z0-9._+-", 128, "an engine or engine release name: letters, digits and "
                       ". _ + -", "vllm-ascend-0.11.0"),
    "file": _grammar("A-Za-z0-9_", "A-Za-z0-9._+-", 255, "one plain file name: letters, digits and . _ + -",
                     "Ascend-cann-toolkit_8.5.0_linux-aarch64.run"),
}


class BadName(ValueError):
    """A value that is not a name of its kind: the message names the input, shows the value and gives the rule."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


def shown(value: object) -> str:
    """``value`` as a message shows it: its ``repr``, so a control or format character in text is escaped."""
    return repr(value)


def unsafe_character(text: str) -> str:
    """The first character of ``text`` no name or path may hold (categories :data:`UNSAFE_CATEGORIES`), or ''."""
    return next((c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES), "")


def template_delimiter(text: str) -> str:
    """The first Jinja delimiter in ``text`` (``{{``, ``{%``, ``{#`` and their closing ones), or ''."""
    return next((d for d in TEMPLATE_DELIMITERS if d in text), "")


def unsafe_text(text: str) -> str:
    """Why ``text`` (any input: a name, a path) is unsafe to show or use, or '': a control or format character,
    or a Jinja delimiter."""
    char = unsafe_character(text)
    if char:
        label = unicodedata.name(char, "")
        return f"it holds the control or format character U+{ord(char):04X}" + (f" ({label})" if label else "")
    delimiter = template_delimiter(text)
    if delimiter:
        return f"it holds the template delimiter {delimiter!r} (a name is data, never a template)"
    return ""


def _why(value: str, grammar: Grammar) -> str:
    """Why ``value`` is not of ``grammar``: the first rule it breaks, in words."""
    unsafe = unsafe_text(value)
    if unsafe:
        return unsafe
    if not value:
        return "it is empty"
    if len(value) > grammar.longest:
        return f"it is {len(value)} characters long"
    if "/" in value or "\\" in value:
        return "it holds a path separator"
    if ".." in value:
        return "it holds '..'"
    if value[0] in "-.":
        return f"it starts with {value[0]!r}"
    bad = next((c for c in value if not grammar.pattern.fullmatch(c) and not grammar.pattern.fullmatch("a" + c)), "")
    return f"it holds {bad!r}" if bad else "it does not match the grammar"


def problem(value: object, kind: str) -> str:
    """'' when ``value`` is a name of ``kind`` (a key of :data:`KINDS`); else why not, in words."""
    grammar = KINDS[kind]
    if not isinstance(value, str):
        return f"it is a {type(value).__name__}, not text"
    if grammar.pattern.fullmatch(value) and ".." not in value:
        return ""
    return _why(value, grammar)


def check(value: object, kind: str, what: str) -> str:
    """``value`` when it is a name of ``kind``; else :class:`BadName` naming ``what`` (the option or field)."""
    why = problem(value, kind)
    if why:
        grammar = KINDS[kind]
        raise BadName(f"{what} {shown(value)} is not a plain {kind} name: {why}",
                      rule=f"write {grammar.rule}, e.g. {grammar.example}")
    return value


def is_name(value: object, kind: str) -> bool:
    return not problem(value, kind)
