"""The data doctor passes around: evidence sections gathered from a host, and findings."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)

# Secrets never reach a report: the gather script redacts them on the node already; this is
# the second line of defence for anything an engine prints (SGLang logs its ServerArgs,
# vLLM its non-default args).
REDACTED = "<redacted>"
_SECRET_PATTERNS = (
    re.compile(r"(?i)((?:VLLM|SGLANG|OPENAI)_API_KEY\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|\S+)"),
    re.compile(r"(?i)(--api[-_]key(?:=|\s+))(\"[^\"]*\"|'[^']*'|\S+)"),
    re.compile(r"(?i)(['\"]?api_key['\"]?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,)]+)"),
    re.compile(r"(?i)(authorization:\s*bearer\s+)(\S+)"),
)


def redact(text: str) -> str:
    """``text`` with every API-key-shaped value replaced by ``<redacted>``."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + (REDACTED if m.group(2) not in ("None", "''", '""')
                                                  else m.group(2)), text)
    return text


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
