"""Fold evidence into a report; render it as text (grouped by host) or JSON; the exit code."""

from __future__ import annotations

import dataclasses
import json

from atlasctl import exitcodes
from atlasctl.doctor.checks import Context, diagnose
from atlasctl.doctor.model import ERROR, INFO, WARNING, Evidence, Finding, redact

_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


@dataclasses.dataclass(frozen=True)
class Report:
    hosts: tuple[str, ...]
    findings: tuple[Finding, ...]
    unreachable: dict[str, str]
    seconds: float

    @property
    def exit_code(self) -> int:
        """3 when a host could not be reached, else 1 on any error finding, else 0."""
        if self.unreachable:
            return exitcodes.ENVIRONMENT
        return exitcodes.FAILED if any(f.severity == ERROR for f in self.findings) else exitcodes.OK

    def for_host(self, host: str) -> list[Finding]:
        return sorted((f for f in self.findings if f.host == host), key=lambda f: (_ORDER[f.severity], f.check))

    def to_dict(self) -> dict:
        return {
            "ok": self.exit_code == exitcodes.OK,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 2),
            "hosts": {h: {"reachable": h not in self.unreachable,
                          "error": redact(self.unreachable[h]) if h in self.unreachable else None,
                          "findings": [f.to_dict() for f in self.for_host(h)]} for h in self.hosts},
        }


def build(hosts: list[str], evidence: dict[str, Evidence], unreachable: dict[str, str], ctx: Context,
          seconds: float, extra: tuple[Finding, ...] | list[Finding] = ()) -> Report:
    """``extra``: findings judged from the inventory on the controller (bundle trust settings)."""
    findings = [f for host in hosts if host in evidence for f in diagnose(evidence[host], ctx)]
    findings += [f for f in extra if f.host in hosts]
    return Report(tuple(hosts), tuple(findings), dict(unreachable), seconds)


def _state(report: Report, host: str) -> str:
    if host in report.unreachable:
        return "UNREACHABLE"
    found = report.for_host(host)
    counts = {s: sum(1 for f in found if f.severity == s) for s in (ERROR, WARNING, INFO)}
    if not counts[ERROR] and not counts[WARNING]:
        return "healthy"
    return ", ".join(f"{n} {s}{'s' if n > 1 else ''}" for s, n in counts.items() if n and s != INFO)


def render_text(report: Report) -> str:
    lines = []
    for host in report.hosts:
        lines.append(f"{host}: {_state(report, host)}")
        if host in report.unreachable:
            lines.append(f"  UNREACHABLE  {redact(report.unreachable[host])}")
        for f in report.for_host(host):
            lines.append(f"  {f.severity.upper():<8} {f.check:<14} {f.message}")
            lines.append(f"  {'':<8} {'':<14} evidence: {f.evidence}")
            lines.append(f"  {'':<8} {'':<14} fix: {f.fix}")
    errors = sum(1 for f in report.findings if f.severity == ERROR)
    summary = f"{len(report.hosts)} host(s), {errors} error(s) in {report.seconds:.1f}s"
    if report.unreachable:
        summary += f"; unreachable: {', '.join(sorted(report.unreachable))}"
    lines.append(summary)
    return "\n".join(lines)


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True)
