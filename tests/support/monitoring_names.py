"""Metric names for the monitoring tests: the names the lab's engines and exporters export (one data file,
tests/fixtures/monitoring/metrics.yml, with each name's source) and the metric names a PromQL expression uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from support.tools import venv_tool

ROOT = Path(__file__).resolve().parents[2]
METRICS = ROOT / "tests/fixtures/monitoring/metrics.yml"
RULES = ROOT / "roles/monitoring/files/atlas-rules.yml"


PROMTOOL, PROMETHEUS = venv_tool("promtool"), venv_tool("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed: `make venv` takes it out of Debian's prometheus package")
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}

# PromQL words that are not metric names (functions and aggregations are followed by "(").
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
             "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\[\]]*\]|\boffset\s+-?[0-9a-z]+")
_NAME = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def exported(exporter: str | None = None) -> set[str]:
    """The sample names of every family of ``exporter`` (all exporters: None)."""
    doc = yaml.safe_load(METRICS.read_text())["exporters"]
    names = set()
    for name, entry in doc.items():
        if exporter in (None, name):
            names |= {family + suffix for family, kind in entry["families"].items() for suffix in SUFFIXES[kind]}
    return names


def promql_names(expr: str) -> set[str]:
    """The metric names an expression selects (strings, label matchers, grouping labels, ranges left out)."""
    text = _STRING.sub('""', str(expr))
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    found = set()
    for match in _NAME.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS or re.fullmatch(r"[0-9].*", word):
            continue
        found.add(word)
    return found


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def recorded() -> set[str]:
    """The series the shipped rules record, and the SLO thresholds the monitoring stage generates."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring

    return {r["record"] for r in rules() if "record" in r} | set(monitoring.SLO_RECORDS.values())
