# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release compatibility gate: is a plan (CANN, engine, Python, torch, driver) possible?

The table is data (``data/compat.yml`` of this collection, plus an inventory's extra tables:
``atlas_compat_extra_tables``, loaded and merged by plugin_utils/site_data.py for the filter plugin
and atlasctl, which have PyYAML); this module only checks a table and judges a plan against it.

A plan is a dict with any of: ``cann``, ``engine``, ``engine_version``, ``python``,
``torch``, ``torch_npu``, ``triton_ascend``, ``vllm``, ``driver`` (empty values are not checked).
The drivers a CANN runs on are a window per CANN (``cann_driver``: ``min_driver``/``max_driver``,
``25.2.X`` for a whole HDK line): :func:`driver_window`, :func:`check_driver`, :func:`common_drivers`.
The glibc a release's engine wheel set needs (``engine_glibc``, from the wheels' manylinux tags) against the node's
(``getconf GNU_LIBC_VERSION``), with the OS releases that carry each glibc (``os_glibc``): :func:`check_glibc`.
``evaluate`` returns a verdict dict: ``ok``, ``problems`` (one sentence each, naming what
the chosen engine needs), ``fixes``, ``row`` (the matching table row or None), ``lab``.

Standard library only.
"""

from __future__ import annotations

import fnmatch
import os
import re

from ansible_collections.atlas.serving.plugins.module_utils.cann import version_key as cann_key

TABLE_FORMAT = 1
TABLE_SECTIONS = ("engines", "torch_npu_cann", "cann_driver", "engine_glibc", "os_glibc")
# The suite's own lowest Python (preflight_min_python): bounds at or below it go unsaid.
SUITE_MIN_PYTHON = (3, 9)
_CLAUSE = re.compile(r"^\s*(>=|<=|==|<|>)\s*(\d+(?:\.\d+)*)\s*$")
_NUM = re.compile(r"\d+")
_GLIBC = re.compile(r"^(\d+)\.(\d+)$")
# What `getconf GNU_LIBC_VERSION` prints on a glibc system: `glibc 2.36`.
_GETCONF_GLIBC = re.compile(r"^glibc (\d+)\.(\d+)(?:\.\d+)*$")


def default_table_path():
    """``<collection>/data/compat.yml``."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "data", "compat.yml")


class CompatTableError(ValueError):
    """The table itself is malformed; the message names the row and the field."""


def check_table(table, extra=False):
    """Validate the table's shape; raise CompatTableError naming the bad row.

    ``extra``: an inventory's extra table (atlas_compat_extra_tables), whose sections may be absent;
    only an extra table may hold a lab row (``lab: true``), never the product's own."""
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise CompatTableError(f"compatibility table: expected a mapping with format: {TABLE_FORMAT}")
    sources = table.get("sources") or {}
    for section in TABLE_SECTIONS:
        rows = table.get(section)
        if extra and rows is None:
            continue
        if not isinstance(rows, list) or (not rows and not extra):
            raise CompatTableError(f"compatibility table: '{section}' must be a {'' if extra else 'non-empty '}list")
        for index, row in enumerate(rows):
            where = f"compatibility table {section}[{index}]"
            if not isinstance(row, dict):
                raise CompatTableError(f"{where}: must be a mapping")
            if row.get("source") not in sources:
                raise CompatTableError(f"{where}: source {row.get('source')!r} is not one of the table's sources")
    for index, row in enumerate(table.get("engines") or []):
        where = f"compatibility table engines[{index}] ({row.get('engine')})"
        if not row.get("engine") or not isinstance(row.get("versions"), list) or not row["versions"]:
            raise CompatTableError(f"{where}: needs engine and versions (a list of patterns)")
        if row.get("lab") and not extra:
            raise CompatTableError(f"{where}: a lab row (lab: true) is accepted only from an inventory's extra "
                                   "table (atlas_compat_extra_tables, e.g. inventory/lab/compat.yml), not from the "
                                   "product's table")
        if not row.get("lab") and not row.get("cann"):
            raise CompatTableError(f"{where}: an NPU engine row needs its cann list (or lab: true)")
        for clause in _clauses(row.get("python") or ""):
            if clause is None:
                raise CompatTableError(f"{where}: python {row.get('python')!r} is not a range like >=3.9,<3.12")
    for index, row in enumerate(table.get("cann_driver") or []):
        where = f"compatibility table cann_driver[{index}] (CANN {row.get('cann')})"
        for key in ("driver", "min_driver", "max_driver"):
            if row.get(key) is not None and _driver_bound(row[key]) is None:
                raise CompatTableError(f"{where}: {key} {row[key]!r} is not an HDK version like 25.5.0, 26.0.RC1 "
                                       "or 25.2.X")
        if (row.get("min_driver") is None) != (row.get("max_driver") is None):
            raise CompatTableError(f"{where}: a driver window needs both min_driver and max_driver")
        if row.get("min_driver") is not None and _driver_bound(row["min_driver"])[0] > _driver_bound(
                row["max_driver"])[1]:
            raise CompatTableError(f"{where}: min_driver {row['min_driver']} is above max_driver {row['max_driver']}")
    for index, row in enumerate(table.get("engine_glibc") or []):
        where = f"compatibility table engine_glibc[{index}] ({row.get('engine')})"
        if not row.get("engine") or not isinstance(row.get("versions"), list) or not row["versions"]:
            raise CompatTableError(f"{where}: needs engine and versions (a list of patterns)")
        if not _GLIBC.match(str(row.get("glibc", ""))):
            raise CompatTableError(f"{where}: glibc {row.get('glibc')!r} is not a glibc version like 2.34")
    for index, row in enumerate(table.get("os_glibc") or []):
        where = f"compatibility table os_glibc[{index}] ({row.get('os')} {row.get('version')})"
        if not row.get("os") or not row.get("version"):
            raise CompatTableError(f"{where}: needs os and version")
        if not _GLIBC.match(str(row.get("glibc", ""))):
            raise CompatTableError(f"{where}: glibc {row.get('glibc')!r} is not a glibc version like 2.34")
    return table


def _clauses(spec):
    if not spec:
        return []
    out = []
    for part in str(spec).split(","):
        match = _CLAUSE.match(part)
        out.append((match.group(1), _vtuple(match.group(2))) if match else None)
    return out


def _vtuple(text):
    return tuple(int(n) for n in _NUM.findall(str(text))[:3])


def python_satisfies(version, spec):
    """``3.11.2`` satisfies ``>=3.9,<3.12``; compares as many components as the bound has."""
    have = _vtuple(version)
    for clause in _clauses(spec):
        if clause is None:
            raise CompatTableError(f"python range {spec!r} is not of the form >=3.9,<3.12")
        op, bound = clause
        mine = have[: len(bound)]
        ok = {">=": mine >= bound, "<=": mine <= bound, "==": mine == bound,
              "<": mine < bound, ">": mine > bound}[op]
        if not ok:
            return False
    return True


def python_label(spec):
    """``>=3.9,<3.12`` -> ``<3.12`` (the suite needs 3.9 anyway); ``>=3.10,<3.12`` stays."""
    kept = []
    for clause in _clauses(spec):
        if clause and clause[0] == ">=" and clause[1] <= SUITE_MIN_PYTHON:
            continue
        kept.append(f"{clause[0]}{'.'.join(map(str, clause[1]))}" if clause else "?")
    return ",".join(kept)


def _same_release(a, b):
    return str(a).strip().lower() == str(b).strip().lower()


def find_row(table, engine, version, section="engines"):
    """The row of ``section`` (engines, engine_glibc) whose engine is ``engine`` and whose versions match ``version``
    (first match wins), or None."""
    for row in table.get(section) or []:
        if row["engine"] == engine and any(fnmatch.fnmatchcase(str(version), str(p)) for p in row["versions"]):
            return row
    return None


def requirement_text(row):
    """``CANN 8.3.RC2 (torch-npu 2.7.1, Python <3.12)``."""
    cann = " or ".join(str(c) for c in row.get("cann") or [])
    extras = []
    if row.get("torch_npu"):
        extras.append(f"torch-npu {row['torch_npu']}")
    if row.get("python"):
        extras.append(f"Python {python_label(row['python'])}")
    return f"CANN {cann}" + (f" ({', '.join(extras)})" if extras else "")


def engines_for_cann(table, cann):
    """NPU engine releases the table says run on ``cann``: ['vllm-ascend 0.13.0', ...]."""
    return [
        f"{row['engine']} {'/'.join(row['versions'])}"
        for row in table["engines"]
        if not row.get("lab") and any(_same_release(c, cann) for c in row.get("cann") or [])
    ]


def evaluate(plan, table):
    """Judge one plan; see the module docstring for the verdict's keys."""
    plan = {k: str(v).strip() for k, v in (plan or {}).items() if v not in (None, "")}
    problems, fixes = [], []
    engine, version, cann = plan.get("engine", ""), plan.get("engine_version", ""), plan.get("cann", "")
    verdict = {"ok": True, "plan": plan, "problems": problems, "fixes": fixes, "row": None, "lab": False}
    if cann and cann_key(cann) is None:
        problems.append(f"CANN {cann!r} is not a CANN release name (forms: 7.0.RC1, 8.3.RC2, 8.5.0)")
        fixes.append("set cann_version to the version in the package names")
    if not engine:
        _check_torch_npu(plan, None, table, problems, fixes)
        verdict["ok"] = not problems
        return verdict
    row = find_row(table, engine, version)
    if row is None:
        known = sorted({f"{r['engine']} {'/'.join(r['versions'])}" for r in table["engines"] if r["engine"] == engine})
        problems.append(
            f"{engine} {version or '(no version)'} is not in the compatibility table"
            + (f"; it knows {', '.join(known)}" if known else "; it knows no release of that engine")
        )
        fixes.append("choose a release the table knows, or add its row with a source to data/compat.yml "
                     "(or to an extra table the inventory names in atlas_compat_extra_tables)")
        verdict["ok"] = False
        return verdict
    verdict["row"], verdict["lab"] = row, bool(row.get("lab"))
    source = (table.get("sources") or {}).get(row.get("source"), {})
    verdict["source"] = f"{source.get('title', row.get('source'))} <{source.get('url', '')}>"
    if row.get("lab"):
        verdict["ok"] = not problems
        return verdict
    needs = f"{engine} {version} needs {requirement_text(row)}"
    if not cann:
        problems.append(f"{needs}; the plan names no CANN")
        fixes.append(f"set cann_version: {row['cann'][0]}")
    elif not any(_same_release(cann, c) for c in row["cann"]):
        problems.append(needs)
        others = engines_for_cann(table, cann)
        fixes.append(
            f"set cann_version: {row['cann'][0]} (and carry CANN {row['cann'][0]} in the bundle), or choose an "
            f"engine release made for CANN {cann}: "
            + (", ".join(others) if others else "the table has none")
        )
    _check_pins(plan, row, needs, problems, fixes)
    _check_torch_npu(plan, row, table, problems, fixes)
    verdict["ok"] = not problems
    return verdict


def _check_pins(plan, row, needs, problems, fixes):
    if plan.get("python") and row.get("python") and not python_satisfies(plan["python"], row["python"]):
        problems.append(f"{needs}: Python {plan['python']} is outside {row['python']}")
        fixes.append(f"use a Python in {row['python']} for the engine's environment")
    for key, label in (("torch", "torch"), ("torch_npu", "torch-npu"), ("triton_ascend", "triton-ascend"),
                       ("vllm", "vLLM")):
        want = row.get(key)
        if plan.get(key) and want and not fnmatch.fnmatchcase(plan[key], str(want)):
            problems.append(f"{plan['engine']} {plan['engine_version']} is built for {label} {want}, "
                            f"not {plan[key]}")
            fixes.append(f"pin {label} {want} in the engine's wheelset")


def _check_torch_npu(plan, row, table, problems, fixes):
    """torch-npu vs CANN from Ascend/pytorch, only where the engine row does not pin torch-npu."""
    if not plan.get("torch_npu") or not plan.get("cann") or (row and row.get("torch_npu")):
        return
    for entry in table["torch_npu_cann"]:
        if _same_release(entry["cann"], plan["cann"]):
            if plan["torch_npu"] not in [str(t) for t in entry["torch_npu"]]:
                problems.append(f"torch-npu {plan['torch_npu']} is not made for CANN {plan['cann']} "
                                f"(Ascend/pytorch pairs it with {', '.join(map(str, entry['torch_npu']))})")
                fixes.append(f"use torch-npu {entry['torch_npu'][0]} or the CANN its release notes name")
            return


def paired_driver(table, cann):
    """The driver (HDK) released with ``cann``, or None when the table has no pair."""
    for entry in table["cann_driver"]:
        if _same_release(entry["cann"], cann) and entry.get("driver"):
            return str(entry["driver"])
    return None


def driver_key(version):
    """Sort key of an HDK version (``25.5.0``, ``26.0.RC1``; npu-smi prints ``24.1.rc1``), or None."""
    return cann_key(str(version or "").strip().upper().replace("-", "."))


def _driver_bound(text):
    """(lowest key, highest key) a window end stands for: ``25.2.X`` the whole 25.2 line, else the version and
    its patches (``26.1.0`` covers ``26.1.0.1``)."""
    text = str(text).strip().upper()
    if text.endswith(".X"):
        line = _NUM.findall(text[:-2])
        if len(line) != 2:
            return None
        major, minor = int(line[0]), int(line[1])
        return (major, minor, 0, 0), (major, minor, 1, 1 << 30)
    key = driver_key(text)
    return None if key is None else (key, key + (1 << 30,))


def driver_window(table, cann):
    """{cann, min, max, paired, source, note} of the drivers ``cann`` runs on, or None when the table has no
    window for it (``paired`` may still be known: :func:`paired_driver`)."""
    for entry in table["cann_driver"]:
        if _same_release(entry["cann"], cann) and entry.get("min_driver") is not None:
            return {"cann": str(entry["cann"]), "min": str(entry["min_driver"]), "max": str(entry["max_driver"]),
                    "paired": str(entry["driver"]) if entry.get("driver") else None,
                    "source": entry.get("source"), "note": entry.get("note", "")}
    return None


def driver_in_window(table, cann, driver):
    """True/False: whether ``driver`` is in ``cann``'s window; None when no window is known or the driver
    is not a version."""
    window, key = driver_window(table, cann), driver_key(driver)
    if window is None or key is None:
        return None
    return _driver_bound(window["min"])[0] <= key <= _driver_bound(window["max"])[1]


def common_drivers(table, canns):
    """The window (min, max) every CANN of ``canns`` runs on, as texts of the table, or None when one has no
    known window or they share no driver: a driver in it can be installed first while either CANN serves."""
    windows = [driver_window(table, c) for c in canns]
    if not windows or any(w is None for w in windows):
        return None
    low = max((w["min"] for w in windows), key=lambda t: _driver_bound(t)[0])
    high = min((w["max"] for w in windows), key=lambda t: _driver_bound(t)[1])
    return (low, high) if _driver_bound(low)[0] <= _driver_bound(high)[1] else None


def check_driver(table, cann, driver):
    """None when the node's driver runs ``cann`` (in its window, or the pair when only the pair is known, or
    nothing is known), else a sentence naming both, the window and its source."""
    if not driver:
        return None
    window = driver_window(table, cann)
    if window is not None:
        inside = driver_in_window(table, cann, driver)
        if inside is not False:
            return None
        url = ((table.get("sources") or {}).get(window["source"]) or {}).get("url", window["source"])
        paired = f", released with {window['paired']}" if window["paired"] else ""
        return (f"driver {driver} is outside the drivers CANN {cann} runs on ({window['min']} to {window['max']}"
                f"{paired}; {url}): upgrade the driver into that window (firmware first) before CANN")
    want = paired_driver(table, cann)
    if want is None:
        return None
    have, need = str(driver).lower(), want.lower()
    if have == need or have.startswith(need + "."):
        return None
    return (f"driver {driver} is not the HDK released with CANN {cann} ({want}); Huawei tests CANN {cann} "
            f"with driver {want}: upgrade the driver (firmware first) or confirm the pair in Huawei's "
            "compatibility notes")


def evaluate_fleet(plans, table):
    """Judge the plans of many hosts at once: hosts with identical plans share one verdict.

    ``plans`` maps host -> plan. Returns ``ok``, ``groups`` (list of {hosts, plan, verdict})
    and ``report`` (one line per refused group, host names first).
    """
    groups = {}
    for host in sorted(plans):
        key = tuple(sorted((k, str(v)) for k, v in (plans[host] or {}).items() if v not in (None, "")))
        groups.setdefault(key, []).append(host)
    out, lines = [], []
    for key, hosts in groups.items():
        verdict = evaluate(dict(key), table)
        out.append({"hosts": hosts, "plan": dict(key), "verdict": verdict})
        if not verdict["ok"]:
            lines.append(f"{', '.join(hosts)}: {describe_plan(dict(key))}: " + "; ".join(verdict["problems"])
                         + ". Fix: " + "; or ".join(verdict["fixes"]) + "."
                         + (f" Source: {verdict['source']}." if verdict.get("source") else ""))
    return {"ok": not lines, "groups": out, "report": lines}


def describe_plan(plan):
    parts = []
    if plan.get("cann"):
        parts.append(f"CANN {plan['cann']}")
    if plan.get("engine"):
        parts.append(f"{plan['engine']} {plan.get('engine_version', '')}".strip())
    for key, label in (("python", "Python"), ("torch", "torch"), ("torch_npu", "torch-npu"), ("vllm", "vLLM")):
        if plan.get(key):
            parts.append(f"{label} {plan[key]}")
    return " with ".join(parts[:2]) + (f" ({', '.join(parts[2:])})" if parts[2:] else "") if parts else "empty plan"


def evaluate_pins(plan, table):
    """Judge an engine's wheel pins (engine, engine_version, python, torch, torch_npu, vllm) when no CANN is
    chosen yet: an offline bundle that carries no CANN package still refuses pins its engine is not built for."""
    plan = {k: str(v).strip() for k, v in (plan or {}).items() if v not in (None, "")}
    problems, fixes = [], []
    verdict = {"ok": True, "plan": plan, "problems": problems, "fixes": fixes, "row": None, "lab": False}
    row = find_row(table, plan.get("engine", ""), plan.get("engine_version", ""))
    if row is None:
        return evaluate(plan, table)  # the same refusal, naming the releases the table knows
    verdict["row"], verdict["lab"] = row, bool(row.get("lab"))
    if not row.get("lab"):
        _check_pins(plan, row, f"{plan['engine']} {plan.get('engine_version', '')} needs {requirement_text(row)}",
                    problems, fixes)
    verdict["ok"] = not problems
    return verdict


# --- glibc: which engine wheel sets a node can take ----------------------------------------------------------------


class GlibcError(ValueError):
    """What the node printed for its C library is not a glibc version."""


def glibc_version(getconf_output):
    """(2, 36) from ``glibc 2.36``, what ``getconf GNU_LIBC_VERSION`` prints; GlibcError naming the output when it is
    anything else (a C library other than glibc, or no getconf)."""
    text = str(getconf_output or "").strip()
    match = _GETCONF_GLIBC.match(text)
    if not match:
        said = f"printed {text!r}" if text else "printed nothing"
        raise GlibcError(f"`getconf GNU_LIBC_VERSION` {said}, not `glibc <major>.<minor>`")
    return int(match.group(1)), int(match.group(2))


def _glibc_key(text):
    major, minor = _GLIBC.match(str(text)).groups()
    return int(major), int(minor)


def glibc_row(table, engine, version):
    """The engine_glibc row of ``engine`` ``version`` (first match), or None: the table knows no need then."""
    return find_row(table, engine, version, section="engine_glibc")


def sets_for_glibc(table, glibc):
    """The wheel sets a node of glibc ``glibc`` ((2, 28)) takes: ['vllm-ascend 0.11.0 (glibc 2.28)', ...]."""
    return [f"{row['engine']} {'/'.join(map(str, row['versions']))} (glibc {row['glibc']})"
            for row in table.get("engine_glibc") or [] if _glibc_key(row["glibc"]) <= tuple(glibc)]


def os_for_glibc(table, need):
    """The OS releases of the table whose glibc is ``need`` ('2.34') or newer: ['openEuler 22.03 LTS with 2.34']."""
    return [f"{row['os']} {row['version']} with {row['glibc']}"
            for row in table.get("os_glibc") or [] if _glibc_key(row["glibc"]) >= _glibc_key(need)]


def check_glibc(table, engine, version, getconf_output, node="", os_label=""):
    """Empty text when the node's glibc (``getconf_output``) takes ``engine`` ``version``'s wheel set, or when the
    table knows no glibc for that release; else the refusal: the node (``node``, ``os_label``), its glibc, what the
    set needs and why, the sets that fit the node, and the fixes."""
    row = glibc_row(table, engine, version)
    if row is None:
        return ""
    need, release = str(row["glibc"]), f"{engine} {version}"
    who = f"{node or 'the node'}" + (f" ({os_label.strip()})" if str(os_label or "").strip() else "")
    source = ((table.get("sources") or {}).get(row.get("source")) or {}).get("url", row.get("source"))
    why = f"{row['wheels']}; {source}" if row.get("wheels") else source
    oses = os_for_glibc(table, need)
    move = f"move the node to an OS with glibc {need} or newer" + (f" ({', '.join(oses)})" if oses else "")
    container = "serve it from a container release (serving_runtime: container; the image brings its own glibc)"
    try:
        have = glibc_version(getconf_output)
    except GlibcError as exc:
        return (f"{who}: {exc}, so its glibc cannot be told; the {release} wheel set needs glibc {need} or newer "
                f"({why}). Fix: {move}, or {container}.")
    if have >= _glibc_key(need):
        return ""
    label = f"{have[0]}.{have[1]}"
    fits = sets_for_glibc(table, have)
    fixes = (["choose one of them (engines_version, with its profile and bundle)"] if fits else []) + [move, container]
    return (f"{who} has glibc {label}; the {release} wheel set needs glibc {need} or newer ({why}). "
            f"Wheel sets that fit glibc {label}: {', '.join(fits) if fits else 'none the compatibility table knows'}. "
            f"Fix: {', '.join(fixes[:-1])}, or {fixes[-1]}.")
