"""atlasctl entry point: subcommands discovered, errors mapped to exit codes, health rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import bundle, cli, exitcodes
from atlasctl.commands import command_names
from atlasctl.commands.health import render_table, rows_from
from atlasctl.runner import HostResult, RunResult


def test_every_product_subcommand_is_registered():
    assert {"bundle", "models", "health"} <= set(command_names()) and "lab" not in command_names()
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0


def test_without_the_collection_on_the_path_the_cli_names_it_and_the_fix(tmp_path):
    """atlasctl imports the atlas.serving collection from the Python path (a .pth file): a Python without it gets
    the problem and the fix, no traceback."""
    hidden = ("import sys; from pathlib import Path; "
              "sys.path[:] = [p for p in sys.path if not (Path(p) / 'ansible_collections').is_dir()]; "
              "from atlasctl.cli import main; sys.exit(main(['--version']))")
    run = subprocess.run([sys.executable, "-c", hidden], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == exitcodes.ENVIRONMENT, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.startswith("atlasctl: error: ansible_collections is not importable: the atlas.serving "
                                 "collection is not on the Python path\n  fix: reinstall atlasctl from its wheel")


def test_bundle_verify_exit_codes(tmp_path, capsys):
    (tmp_path / "cann").mkdir()
    pkg = tmp_path / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run"
    pkg.write_bytes(os.urandom(1000))
    bundle.write_manifest(tmp_path, "t")
    # unsigned: the explicit opt-in (signatures: test_bundle_signature.py)
    assert cli.main(["bundle", "verify", str(tmp_path), "--json", "--allow-unsigned"]) == exitcodes.OK
    assert json.loads(capsys.readouterr().out)["ok"] is True
    pkg.write_bytes(pkg.read_bytes()[:-1] + b"\x00")
    assert cli.main(["bundle", "verify", str(tmp_path), "--allow-unsigned"]) == exitcodes.FAILED
    err = capsys.readouterr().err
    assert "Ascend-cann-toolkit_8.5.0_linux-x86_64.run: sha256 mismatch" in err


def test_missing_bundle_is_a_usage_error_naming_the_path(tmp_path, capsys):
    assert cli.main(["bundle", "verify", str(tmp_path / "nope")]) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert str(tmp_path / "nope" / "manifest.json") in err and "fix:" in err


def test_health_rows_report_unreachable_and_failed_hosts():
    result = RunResult("failed", 2, {
        "n1": HostResult("n1", facts={"health_report": {"host": "n1", "service": "active", "health": "200"}}),
        "n2": HostResult("n2", unreachable=True, failed_task="Gathering Facts", message="ssh: timeout"),
        "n3": HostResult("n3", failed=True, failed_task="Health | probe | one completion", message="HTTP 500"),
    }, Path("/tmp"), 1.0)
    rows = rows_from(result)
    assert [r["service"] for r in rows] == ["active", "unreachable", "failed"]
    text = render_table(rows)
    assert "n3: Health | probe | one completion: HTTP 500" in text
    assert text.splitlines()[0].startswith("NODE")


def test_health_waits_a_status_querys_time_for_health_and_refuses_a_bad_wait(monkeypatch, capsys):
    from atlasctl.commands import health

    calls = []
    monkeypatch.setattr(health, "run_playbook", lambda *a, **kw: calls.append(kw) or RunResult(
        "successful", 0, {"n1": HostResult("n1", facts={"health_report": {"host": "n1", "service": "active"}})},
        Path("/tmp"), 1.0))
    assert cli.main(["health", "-i", "inventory/lab"]) == exitcodes.OK
    assert cli.main(["health", "-i", "inventory/lab", "--wait", "600"]) == exitcodes.OK
    assert [c["extravars"] for c in calls] == [{"health_timeout_s": 30}, {"health_timeout_s": 600}]
    for bad in ("0", "x", "3601"):
        with pytest.raises(SystemExit) as caught:
            cli.main(["health", "-i", "inventory/lab", "--wait", bad])
        assert caught.value.code == exitcodes.USAGE
        assert "seconds from 1 to 3600" in capsys.readouterr().err
