# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan of a rollout that may move the platform (driver, firmware, CANN) with the release on top: per wave and
per unit the steps that will run, the levels before and after, the branch capacity left while each batch is
drained, the point of no return and what is refused. Read by ``atlasctl rollout --plan`` and by the rollout
playbook's plan play (the point of no return); docs/platform-upgrades.md.

A unit is a node, or every rank of a multi-node instance (they move together). Its levels before are what the
nodes report (``observed``: the installed driver and firmware, the CANN the running release pins, the release)
or, where no node was read, the inventory's own variables (said in ``assumed``); after, the inventory with the
release's variables over it (an empty ``driver_version`` or ``driver_firmware_version`` leaves that part as it
is).

The steps, in order (``STEPS``): ``drain`` at the branch gateway; where the driver or firmware moves, ``stop``
(the engine stopped, every NPU confirmed free), ``firmware`` then ``driver`` (Huawei's upgrade order), a
``reboot`` where new firmware waits for one (the driver's hot reset runs a new driver at once on freed NPUs);
``cann`` where the release names another CANN; then ``engines``, ``models``, ``serving``, the ``health`` and
``slo`` gates, ``enable``. A unit already on the release at its levels runs the gates and ``enable`` only.

The point of no return: the driver and firmware never go back automatically. Where the new driver is outside the
window of drivers the previous release's CANN runs on (the compatibility table, ``driver_window``), or no source
gives that CANN a window, a rollback of the release would land on a driver its CANN is not known to run on; where
the CANN moves from before 8.5 to 8.5 or later, the installers remove the previous CANN. Either needs
``accept_no_rollback``.

Controller only (never shipped to a node).
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import cann as cann_mu
from ansible_collections.atlas.serving.plugins.module_utils import compat, serving_instance

STEPS = ("drain", "stop", "firmware", "driver", "reboot", "cann", "engines", "models", "serving", "health", "slo",
         "enable")
LEVELS = {"driver": "driver_version", "firmware": "driver_firmware_version", "cann": "cann_version",
          "release": "atlas_release_id", "engine": "engines_name", "engine_version": "engines_version"}
ACCEPT_VAR = "rollout_accept_no_rollback"
ACCEPT_FIX = ("read the plan, then pass --accept-no-rollback (ansible-playbook: -e rollout_accept_no_rollback=true, "
              "or set it in the inventory)")


def _text(value):
    return "" if value is None else str(value).strip()


def levels(variables):
    """{driver, firmware, cann, release, engine, engine_version, runtime} of a host's variables."""
    out = {key: _text(variables.get(var)) for key, var in LEVELS.items()}
    out["runtime"] = _text(variables.get("serving_runtime")) or "venv"
    return out


def _unit_levels(unit, before_vars, after_vars, observed, assumed):
    """(before, after) of a unit: its first rank's (the ranks of one instance share their release's levels)."""
    head = unit[0]
    before = levels(before_vars.get(head, {}))
    seen = (observed or {}).get(head)
    if seen:
        before.update({k: _text(v) for k, v in seen.items() if k in before and _text(v)})
    else:
        assumed.add(head)
    after = levels(after_vars.get(head, {}))
    for part in ("driver", "firmware"):  # empty: the driver stage leaves that part as it is
        after[part] = after[part] or before[part]
    return before, after


def _moves(before, after):
    return {part: (before.get(part, ""), after[part]) for part in ("firmware", "driver", "cann")
            if after.get(part) and after[part] != before.get(part, "")}


def unit_steps(before, after, converged=False):
    """The steps of one unit (a sublist of ``STEPS``) and the notes that explain them."""
    moves = _moves(before, after)
    if converged and not moves:
        return ["health", "slo", "enable"], ["already on the release at its levels: gates and enable only"]
    steps, notes = ["drain"], []
    if "firmware" in moves or "driver" in moves:
        steps.append("stop")
        notes.append("the engine stops and every NPU is confirmed free before the first installer")
    if "firmware" in moves:
        steps.append("firmware")
    if "driver" in moves:
        steps.append("driver")
    if "firmware" in moves:
        steps.append("reboot")
        notes.append("new firmware is activated by the reboot (the driver with it)")
    elif "driver" in moves:
        notes.append("the driver's hot reset runs it at once on the freed NPUs; a reboot only if it fails (exit 2)")
    if "cann" in moves and after["runtime"] != "container":
        steps.append("cann")
        prev, new = moves["cann"]
        keeps = prev and cann_mu.layout_of(prev) == cann_mu.layout_of(new)
        notes.append(f"CANN {new} installs beside {prev} (kept for the previous release)" if keeps else
                     f"CANN {new} replaces {prev or 'nothing'}" + (" (the 8.5 layout cannot keep it)" if prev else ""))
    steps += ["engines", "models", "serving", "health", "slo", "enable"]
    return steps, notes


def no_return(before, after, table):
    """Why moving this unit cannot be rolled back automatically ([] when it can): one sentence per reason."""
    why = []
    moves = _moves(before, after)
    prev_cann = before.get("cann", "")
    if "driver" in moves and prev_cann and before.get("runtime") != "container":
        new_driver = moves["driver"][1]
        inside = compat.driver_in_window(table, prev_cann, new_driver)
        window = compat.driver_window(table, prev_cann)
        if inside is False:
            why.append(f"driver {new_driver} is outside the drivers CANN {prev_cann} runs on ({window['min']} to "
                       f"{window['max']}, {window['source']}): a rollback of the release would not run on it")
        elif inside is None:
            why.append(f"no source in the compatibility table says driver {new_driver} runs CANN {prev_cann} (the "
                       "previous release's): a rollback of the release may not run on it")
    if "cann" in moves and prev_cann and cann_mu.layout_of(prev_cann) != cann_mu.layout_of(moves["cann"][1]):
        why.append(f"CANN {moves['cann'][1]} cannot be installed beside {prev_cann} (Huawei's installers: moving to "
                   "the 8.5 layout removes the earlier versions): the previous release loses its CANN")
    return why


def _branch(host, groups_of, prefix):
    return next((g[len(prefix):] for g in groups_of.get(host, []) if g.startswith(prefix)), "")


def _capacity(wave, entries, groups_of, prefix, after_vars):
    """{branch: {backends, drained_at_once, left, last_backend_ok}} while the wave's batches are drained."""
    backends = {}
    for host in entries:
        backends.setdefault(_branch(host, groups_of, prefix), set()).add(host)
    out, start = {}, 0
    for size in wave.get("batches") or [len(wave["hosts"])]:
        batch = wave["hosts"][start:start + size]
        start += size
        for branch in {_branch(h, groups_of, prefix) for h in batch}:
            drained = len([h for h in batch if h in entries and _branch(h, groups_of, prefix) == branch])
            total = len(backends.get(branch, ()))
            cell = out.setdefault(branch, {"backends": total, "drained_at_once": 0, "left": total,
                                           "last_backend_ok": any(bool(after_vars.get(h, {}).get(
                                               "gateway_drain_last_backend")) for h in backends.get(branch, ()))})
            cell["drained_at_once"] = max(cell["drained_at_once"], drained)
            cell["left"] = total - cell["drained_at_once"]
    return out


def plan(release, waves, before_vars, after_vars, groups_of, table, *, observed=None, serving_instances=None,
         accept_no_rollback=False, prefix="branch_"):
    """The whole plan (see the module docstring): {release, ok, waves, point_of_no_return, refused, warnings,
    assumed}. ``waves``: rollout_waves.plan's; ``before_vars``/``after_vars``: {host: variables};
    ``groups_of``: {host: [its groups]}; ``observed``: {host: levels a node reported}."""
    instances = serving_instances or {}
    fleet = [h for wave in waves for h in wave["hosts"]]
    entries = set(serving_instance.entry_nodes(fleet, instances))
    assumed, refused, warnings, pnr_units, pnr_why = set(), [], [], [], []
    out_waves = []
    for wave in waves:
        units = []
        for unit in wave.get("units") or [[h] for h in wave["hosts"]]:
            before, after = _unit_levels(unit, before_vars, after_vars, observed, assumed)
            converged = bool((observed or {}).get(unit[0])) and before["release"] == release
            steps, notes = unit_steps(before, after, converged)
            why = no_return(before, after, table)
            if why:
                pnr_units.append(unit)
                pnr_why += [f"{' + '.join(unit)}: {w}" for w in why]
            problem = compat.check_driver(table, after["cann"], after["driver"]) if after["cann"] else None
            if problem:
                warnings.append(f"{' + '.join(unit)}: {problem}")
            units.append({"hosts": list(unit), "branch": _branch(unit[0], groups_of, prefix), "steps": steps,
                          "before": {k: before[k] for k in ("release", "driver", "firmware", "cann")},
                          "after": {k: after[k] for k in ("release", "driver", "firmware", "cann")},
                          "notes": notes, "point_of_no_return": bool(why)})
        capacity = _capacity(wave, entries, groups_of, prefix, after_vars)
        for branch, cell in sorted(capacity.items()):
            if cell["backends"] and cell["left"] < 1 and not cell["last_backend_ok"]:
                refused.append({"what": f"wave {wave['name']}: branch {branch or '(none)'}",
                                "why": f"a batch drains all {cell['backends']} backend(s) of the branch: it would "
                                       "stop serving",
                                "fix": "lower the wave's serial, add a backend to the branch, or accept the outage "
                                       "for a one-node branch (gateway_drain_last_backend: true)"})
        out_waves.append({"name": wave["name"], "index": wave.get("index"), "skipped": bool(wave.get("skipped")),
                          "units": units, "capacity": capacity})
    accepted = bool(accept_no_rollback)
    if pnr_units and not accepted:
        first = next(u for w in out_waves for u in w["units"] if u["point_of_no_return"])
        refused.append({"what": "the point of no return",
                        "why": f"from {' + '.join(first['hosts'])} on, a rollback cannot bring the previous "
                               "platform back: " + "; ".join(pnr_why),
                        "fix": ACCEPT_FIX})
    return {
        "release": release,
        "ok": not refused,
        "waves": out_waves,
        "point_of_no_return": {"units": pnr_units, "why": pnr_why, "accepted": accepted and bool(pnr_units)},
        "refused": refused,
        "warnings": warnings,
        "assumed": sorted(assumed),
    }
