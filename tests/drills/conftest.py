"""Fault drills (`.venv/bin/pytest -ra tests/drills`): one lab for the whole suite, the drill
table printed at the end of the run and written to artifacts/drills/report.json.

``drill_lab`` (session): a fresh lab with its bundle (under the machine's lab lock, through
labtools.fresh_lab_session), site.yml once; brought down at the end of the session.
Drills run only when tests/drills is named on the command line: a plain `pytest tests`
would otherwise hold two labs' worth of time (and the lab lock) in one session.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (ROOT / "tests" / "lab", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import pytest  # noqa: E402
from labtools import LOCK_WAIT, fresh_lab_session, lab_hosts, lab_prerequisites, playbook  # noqa: E402

REPORT = ROOT / "artifacts" / "drills" / "report.json"
CLOCK: dict[str, float | str] = {}
COLUMNS = [("drill", "id", 14), ("fault injected", "fault", 28), ("expected", "expected", 34),
           ("observed", "observed", 58), ("requests failed", "requests_failed", 8), ("data lost", "data_lost", 28),
           ("result", "result", 6)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drill: an operator-facing fault drill (tests/drills, run on its own)")
    CLOCK["start"] = time.monotonic()
    CLOCK["started_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _asked_for_drills(config: pytest.Config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0])
        path = (path if path.is_absolute() else Path(config.invocation_params.dir) / path).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    if _asked_for_drills(config):
        return
    skip = pytest.mark.skip(reason="fault drills run on their own: pytest tests/drills (make drills)")
    for item in items:
        if item.get_closest_marker("drill"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def drill_lab():
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    with fresh_lab_session(bundle=True):
        site = playbook("site.yml")
        CLOCK["lock_wait"] = LOCK_WAIT["seconds"]
        CLOCK["setup"] = time.monotonic() - started - LOCK_WAIT["seconds"]
        if site.returncode != 0:
            pytest.fail("site.yml failed on the fresh lab: no drill can start\n" + site.stdout[-4000:])
        yield lab_hosts()


def _table(rows: list[dict]) -> list[str]:
    widths = [w for _, _, w in COLUMNS]
    titles = [textwrap.wrap(title, w) for (title, _, w) in COLUMNS]
    lines = [" | ".join((t[i] if i < len(t) else "").ljust(w) for t, w in zip(titles, widths, strict=True))
             for i in range(max(len(t) for t in titles))]
    lines.append("-+-".join("-" * w for w in widths))
    for row in rows:
        cells = [textwrap.wrap(str(row[key]), w, break_long_words=True, break_on_hyphens=False) or [""]
                 for (_, key, w) in COLUMNS]
        for i in range(max(len(c) for c in cells)):
            lines.append(" | ".join((c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)))
        lines.append("-+-".join("-" * w for w in widths))
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from drill_common import RESULTS
    from drill_table import DRILLS

    if not RESULTS:
        return
    rows = [dataclasses.asdict(RESULTS[d.id]) for d in DRILLS if d.id in RESULTS]
    wall = time.monotonic() - float(CLOCK["start"])
    passed = sum(r["result"] == "PASS" for r in rows)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"started_at": CLOCK["started_at"], "wall_seconds": round(wall, 1),
                                  "lock_wait_seconds": round(float(CLOCK.get("lock_wait", 0)), 1),
                                  "setup_seconds": round(float(CLOCK.get("setup", 0)), 1),
                                  "passed": passed, "drills": rows}, indent=1) + "\n")
    write = terminalreporter.write_line
    terminalreporter.section("fault drills")
    for line in _table(rows):
        write(line)
    for row in rows:
        if row["unmet"]:
            write(f"{row['id']}: unmet: {'; '.join(row['unmet'])}")
    waited = float(CLOCK.get("lock_wait", 0))
    own = wall - waited
    write(f"{passed} of {len(rows)} drills as expected; wall time {own // 60:.0f} min {own % 60:.0f} s "
          f"(lab up + bundle + site.yml {float(CLOCK.get('setup', 0)):.0f} s, drills "
          f"{sum(r['seconds'] for r in rows):.0f} s), plus {waited:.0f} s waiting for another run's lab; "
          f"report: {REPORT}")
