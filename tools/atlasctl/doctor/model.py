"""The data doctor passes around: evidence sections gathered from a host, and findings."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from atlasctl.layout import Layout, default_layout

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)

# Secrets never reach a report: the gather script redacts them on the node already; this is
# the second line of defence for anything an engine prints (SGLang logs its ServerArgs,
# vLLM its non-default args).
REDACTED = "<redacted>"
# api_key, api-key, apikey, api_keys, VLLM_API_KEY, SGLANG_API_KEY, serving_api_keys, the X-API-Key header, ...
_NAME = r"(?:\b\w*?_|\bx-)?api[-_]?keys?"
_QUOTED = r"\"[^\"\n]*\"|'[^'\n]*'"
_EMPTY = frozenset(["None", "null", "''", '""', "[]"])
# --api-key k1 'k2' "k3" (vLLM's --api-key takes several); --api-key=k; the .args form, one value per line
_CLI_WORDS = re.compile(rf"(?i)(--api[-_]key)((?:[ \t]+(?:{_QUOTED}|[^-\s'\"]\S*))+)")
_CLI_EQ = re.compile(rf"(?i)(--api[-_]key=)({_QUOTED}|\S+)")
_CLI_LINES = re.compile(r"(?im)^([ \t]*--api[-_]key[ \t]*)((?:\n(?![ \t]*-)[^\n]*)+)")
# VLLM_API_KEY=k, api_key: k, "api_key": "k", api_key='k' (a repr), api_key: [k1, k2], api_key=['k1', 'k2'],
# X-API-Key: k, api_keys=k, apikey=k
_ASSIGN = re.compile(rf"(?i)((?<![-\w])['\"]?{_NAME}['\"]?[ \t]*[=:][ \t]*)(\[[^\]\n]*\]|{_QUOTED}|[^\s,)}}\]]+)")
# api_key:\n  - k1\n  - k2 (a YAML block list; serving_api_keys: too)
_BLOCK = re.compile(rf"(?im)^([ \t]*['\"]?{_NAME}['\"]?[ \t]*:[ \t]*)((?:\n[ \t]*-[ \t]+[^\n]*)+)")
_BEARER = re.compile(r"(?i)(authorization:\s*bearer\s+)(\S+)")


def _hide(match: re.Match) -> str:
    return match.group(1) + (match.group(2) if match.group(2) in _EMPTY else REDACTED)


def _hide_words(match: re.Match) -> str:
    words = re.findall(rf"[ \t]+|{_QUOTED}|\S+", match.group(2))
    return match.group(1) + "".join(w if not w.strip() else REDACTED for w in words)


def _hide_lines(match: re.Match) -> str:
    lines = match.group(2).split("\n")
    hidden = [re.sub(r"^([ \t]*-[ \t]+)?.*", lambda m: (m.group(1) or "") + REDACTED, line) if line.strip()
              else line for line in lines[1:]]
    return match.group(1) + "\n".join(["", *hidden])


def redact(text: str) -> str:
    """``text`` with every API key replaced by ``<redacted>``, however it is written (flags, variables,
    YAML/JSON/repr values, lists of keys)."""
    text = _BLOCK.sub(_hide_lines, text)
    text = _CLI_LINES.sub(_hide_lines, text)
    text = _CLI_EQ.sub(_hide, text)
    text = _CLI_WORDS.sub(_hide_words, text)
    text = _ASSIGN.sub(_hide, text)
    return _BEARER.sub(_hide, text)


@dataclasses.dataclass(frozen=True)
class Section:
    """One command's output (stdout and stderr together) and its exit status."""

    rc: int
    text: str


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Everything gathered from one host; a section missing from ``sections`` was not gathered."""

    host: str
    sections: Mapping[str, Section]
    # Where the host keeps the service's files (its inventory's layout: roles/layout).
    layout: Layout = dataclasses.field(default_factory=default_layout)

    def section(self, name: str) -> Section | None:
        return self.sections.get(name)

    def text(self, name: str) -> str:
        sec = self.sections.get(name)
        return sec.text if sec is not None else ""

    def ok(self, name: str) -> bool:
        sec = self.sections.get(name)
        return sec is not None and sec.rc == 0


@dataclasses.dataclass(frozen=True)
class Finding:
    host: str
    check: str
    severity: str
    message: str
    evidence: str
    fix: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        for field in ("message", "evidence", "fix"):
            object.__setattr__(self, field, redact(getattr(self, field)))

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)
