"""One test per row of the drill table (drill_table.DRILLS), in table order on one lab: the fleet
is checked converged before each drill, the drill injects its fault, measures and restores, and
the fleet must be converged again after it. Every outcome, expected or not, goes to the report."""

from __future__ import annotations

import time

import pytest
from drill_common import FLEET, RESULTS, Drill, Row, one_line, wait_fleet_ready
from drill_table import DRILLS

pytestmark = [pytest.mark.lab, pytest.mark.drill]


@pytest.mark.parametrize("drill", DRILLS, ids=[d.id for d in DRILLS])
def test_drill(drill_lab, drill: Drill) -> None:
    started = time.monotonic()

    def record(observed: str, failed: int | str, lost: str, unmet: list[str], result: str) -> None:
        RESULTS[drill.id] = Row(drill.id, drill.fault, drill.expected, observed, failed, lost, result, unmet,
                                round(time.monotonic() - started, 1))

    not_ready = [] if FLEET["ready"] else wait_fleet_ready()
    FLEET["ready"] = False
    if not_ready:
        record(f"not run: the fleet was not converged before the drill: {'; '.join(not_ready)}", "n/a", "n/a",
               ["fleet converged before the drill"], "ERROR")
        pytest.fail(f"fleet not converged before {drill.id}: {not_ready}")
    try:
        outcome = drill.run()
    except Exception as exc:
        record(f"drill error: {type(exc).__name__}: {one_line(str(exc), 400)}", "?", "unknown",
               ["the drill ran to its end"], "ERROR")
        raise
    not_ready = wait_fleet_ready()
    FLEET["ready"] = not not_ready
    unmet = outcome.unmet + ([f"fleet converged after the drill ({'; '.join(not_ready)})"] if not_ready else [])
    observed = outcome.observed + (f"; NOT RESTORED: {'; '.join(not_ready)}" if not_ready else "")
    record(observed, outcome.requests_failed, outcome.data_lost, unmet, "PASS" if not unmet else "FAIL")
    assert not unmet, (f"{drill.id}: expected: {drill.expected}\nunmet: {'; '.join(unmet)}\n"
                       f"observed: {outcome.observed}")
