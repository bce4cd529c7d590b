"""Untrusted strings printed to a terminal (docs/security.md, "Threat model per entry point"): a host name, a path,
an engine's reply or a record's field holding a right-to-left override (U+202E), an ANSI escape, a carriage
return or a newline is printed escaped (outputs.safe), so a table cannot be made to say something else than it
holds; HTML pages escape them too; --json stays JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlasctl import cli, exitcodes, outputs
from atlasctl.commands import health
from atlasctl.runner import HostResult, RunResult

RLO = "\u202e"
ESC = "\x1b"
TRICKS = {
    "right-to-left override": f"n1{RLO}evitca",
    "ANSI escape": f"n1{ESC}[2K{ESC}[1Gn9 active",
    "carriage return": "n1\rn9",
    "newline": "n1\nn9  active",
    "line separator": "n1\u2028n9",
    "isolate": "n1\u2066n9\u2069",
    "zero width joiner": "n1\u200dn9",
    "beyond the BMP (a tag)": "n1\U000e0041",
}
RAW = (RLO, ESC, "\r", "\u2028", "\u2066", "\u2069", "\u200d", "\U000e0041")


def _clean(text: str) -> bool:
    """No raw control character but the newlines between lines."""
    return not any(c in text for c in RAW) and all(outputs.safe(line) == line for line in text.split("\n"))


@pytest.mark.parametrize("case", sorted(TRICKS))
def test_safe_makes_every_control_character_visible(case: str) -> None:
    text = outputs.safe(TRICKS[case])
    assert _clean(text) and "\n" not in text and text.startswith("n1\\u")
    assert json.loads(f'"{text}"') == TRICKS[case], "the escapes are JSON's: the text reads back as it was"


def test_safe_lines_keeps_lines_and_tabs_and_nothing_else() -> None:
    assert outputs.safe_lines(f"a\tb\nc{RLO}d\r") == "a\tb\nc\\u202ed\\u000d"
    assert outputs.safe("plain ASCII, Ünïcödé, 漢字") == "plain ASCII, Ünïcödé, 漢字"


def _health(monkeypatch, tmp_path: Path, name: str, problem: str = "") -> None:
    monkeypatch.setenv("ATLAS_STATE_DIR", str(tmp_path / "state"))
    report = {"host": name, "service": "active", "health": "200", "model": f"qwen{RLO}", "bench": "-"}
    hosts = {name: HostResult(name, facts={"health_report": report}),
             "n2": HostResult("n2", unreachable=True, failed_task="Health | ping", message=problem)}
    monkeypatch.setattr(health, "run_playbook", lambda *a, **kw: RunResult("failed", 2, hosts, tmp_path, 0.1))


@pytest.mark.parametrize("case", sorted(TRICKS))
def test_health_prints_a_host_name_with_control_characters_escaped(case: str, monkeypatch, tmp_path: Path,
                                                                    capsys) -> None:
    name = TRICKS[case]
    _health(monkeypatch, tmp_path, name, problem=f"ssh: {name}: no route\nn3  active  200")
    assert cli.main(["health", "-i", str(tmp_path)]) == exitcodes.FAILED
    out = capsys.readouterr().out
    assert _clean(out), ascii(out)
    assert outputs.safe(name) in out and "qwen\\u202e" in out
    table = out.rstrip("\n").split("\n")
    assert len(table) == 5, table  # title, rule, two rows, one problem line: no row forged by a newline
    assert table[2].startswith(f"{outputs.safe(name)}  ") and table[3].startswith("n2 "), table


def test_health_json_stays_json(monkeypatch, tmp_path: Path, capsys) -> None:
    _health(monkeypatch, tmp_path, TRICKS["right-to-left override"])
    assert cli.main(["health", "-i", str(tmp_path), "--json"]) == exitcodes.FAILED
    out = capsys.readouterr().out
    assert _clean(out)
    hosts = {h["host"] for h in json.loads(out)["hosts"]}
    assert TRICKS["right-to-left override"] in hosts


def test_health_html_escapes_markup_and_control_characters(monkeypatch, tmp_path: Path, capsys) -> None:
    _health(monkeypatch, tmp_path, f"<script>alert(1)</script>{RLO}")
    page = tmp_path / "fleet.html"
    cli.main(["health", "-i", str(tmp_path), "--html", str(page)])
    capsys.readouterr()
    text = page.read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text and RLO not in text and "\\u202e" in text


def test_an_error_message_naming_an_input_is_escaped(tmp_path: Path, capsys) -> None:
    """Everything the CLI prints goes through the escaping streams: here argparse's own error line."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["health", "-i", str(tmp_path), f"--bogus{RLO}{ESC}[31m"])
    assert exit_.value.code == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "--bogus\\u202e\\u001b[31m" in err and _clean(err), ascii(err)


def test_the_rollout_html_report_escapes_control_characters() -> None:
    from atlasctl import rollout

    report = {"release": f"r1{RLO}", "status": "ok", "inventory": "inv", "started_at": "t", "seconds": 1,
              "plan": [{"name": "canary", "hosts": [f"<b>{RLO}"]}], "completed": ["canary"], "wave_seconds": {},
              "nodes": [], "failure": None}
    page = rollout.html_report(report)
    assert RLO not in page and "r1\\u202e" in page and "&lt;b&gt;" in page
