"""atlasctl doctor: every diagnosis from tables of evidence -> findings (no SSH, no lab)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import container as CONTAINER
from ansible_collections.atlas.serving.plugins.module_utils import progress

from atlasctl.doctor import checks
from atlasctl.doctor.model import ERROR, INFO, WARNING, Evidence, Finding, Section, redact
from atlaslab.doubles import npu_smi as npu_sim
from support.lab_additions import COMPAT_TABLES as LAB_TABLES

STARTED = 1796021984
MODEL_DIR = "/var/lib/atlas/models/tiny/versions/abc123"


def npu_text(health=("OK",) * 4, used=(3318,) * 4, total=32768, procs=None) -> str:
    """``npu-smi info`` (the lab's double renders it); ``procs``: {npu: [(pid, name, MB)]} in its process table."""
    devices = [{"id": i, "name": "910B4", "health": h, "power_w": 90.0, "temp_c": 40,
                "bus_id": f"0000:{0xC1 + i:02X}:00.0", "hbm_used_mb": u, "hbm_total_mb": total,
                "processes": [{"pid": p, "name": n, "memory_mb": m} for p, n, m in (procs or {}).get(i, [])]}
               for i, (h, u) in enumerate(zip(health, used, strict=True))]
    return npu_sim.render_info({"driver_version": "25.5.0", "devices": devices})


def args_text(engine: str = "sglang", extra: tuple[str, ...] = ()) -> str:
    if engine == "sglang":
        base = ["/opt/atlas/engines/sglang-standin-0.5.6/bin/python", "-m", "sglang.launch_server",
                "--model-path", "/var/lib/atlas/models/tiny/current", "--tp-size", "1",
                "--mem-fraction-static", "0.85", "--port", "30000"]
    else:
        base = ["/opt/atlas/engines/vllm-ascend-0.11.0/bin/vllm", "serve", "/var/lib/atlas/models/tiny/current",
                "--tensor-parallel-size", "1", "--port", "8000"]
    return "#\n# Ansible managed\n#\n" + "\n".join(base + list(extra))


def record(**changes) -> str:
    rec = {"engine": "sglang", "engine_release": "sglang-0.5.6", "model_path": "/var/lib/atlas/models/tiny/current",
           "model_version": "abc123", "port": 30000, "profile": "lab", "release_id": "r1",
           "served_model_name": "tiny", "service": "atlas-serving"}
    rec.update(changes)
    return json.dumps(rec)


VERIFIED = {"config.json": {"size": 10, "mtime_ns": 5, "ino": 7},
            "model.safetensors": {"size": 99, "mtime_ns": 6, "ino": 8}}


def models(stamp: dict | None = "default", files: dict | None = None, version: str = "abc123") -> str:
    """The models section: the stamp vouches for VERIFIED; ``files`` is what is on disk now."""
    files = files if files is not None else VERIFIED
    if stamp == "default":
        stamp = {"format": 1, "root": MODEL_DIR,
                 "files": {k: dict(v, ctime_ns=1, dev=1, md5="m", sha256="s") for k, v in VERIFIED.items()}}
    item = {"name": "tiny", "link": "/var/lib/atlas/models/tiny/current", "target": f"versions/{version}",
            "version": version, "version_dir": MODEL_DIR, "files": files,
            "stamp_path": f"/var/lib/atlas/stamps/model-tiny-{version}.json", "stamp": stamp}
    if stamp is None:
        item["stamp_error"] = "[Errno 2] No such file or directory"
    return json.dumps([item])


VERSIONS = ("== /usr/local/Ascend/driver/version.info\nVersion=25.5.0\n"
            "== /usr/local/Ascend/cann/x86_64-linux/ascend_toolkit_install.info\n"
            "package_name=Ascend-cann-toolkit\nversion=8.5.0\n")


def sglang(running=1.0, queued=0.0, tokens=7.0, requests=1.0, ttft=2.0, itl=30.0) -> dict:
    """One /metrics sample of the SGLang engine, as the node's hang check returns it."""
    text = (f"sglang:num_running_reqs{{tp_rank=\"0\"}} {running}\nsglang:num_queue_reqs{{tp_rank=\"0\"}} {queued}\n"
            f"sglang:generation_tokens_total {tokens}\nsglang:num_requests_total {requests}\n"
            f"sglang:time_to_first_token_seconds_count {ttft}\nsglang:inter_token_latency_seconds_count {itl}\n")
    return progress.reading(text, "sglang")


NO_METRICS = progress.reading("", "sglang", 404, "HTTP 404")
DONE = {"status": 200, "seconds": 0.3, "error": None, "deadline_s": 10.0}
MISSED = {"status": None, "seconds": 10.0, "error": "no answer within 10 s", "deadline_s": 10.0}
INSTANCE = {"name": "ds", "nodes": ["atlas-n4", "atlas-n5"], "rank": 0, "head": "atlas-n4", "entry": True}


def hang(before, after, completion, instance=None) -> Section:
    """The hang section: what the node's program prints (module_utils progress's observe, less the body)."""
    return Section(0, json.dumps({"completion": completion, "before": before, "after": after, "window_s": 10.0,
                                  "url": "http://127.0.0.1:30000", "record": {"instance": instance} if instance
                                  else {}}))


def healthy() -> dict[str, Section]:
    return {
        "npu": Section(0, npu_text()),
        "service": Section(0, "MainPID=958\nResult=success\nNRestarts=0\nExecMainStatus=0\nLoadState=loaded\n"
                              f"ActiveState=active\nSubState=running\nActiveEnterTimestamp=@{STARTED}"),
        "record": Section(0, record()),
        "modes": Section(0, "/etc/atlas/serving/atlas-serving.env 600 root root\n"
                            "/etc/atlas/serving/atlas-serving.args 640 root atlas-serving"),
        "env": Section(0, "# Ansible managed\nPYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n"
                          "SGLANG_SET_CPU_AFFINITY=1\nSGLANG_API_KEY=<redacted>"),
        "args": Section(0, args_text(extra=("--api-key", "<redacted>"))),
        "environ": Section(0, "ASCEND_TOOLKIT_HOME=/usr/local/Ascend/cann\nASCEND_HOME_PATH=/usr/local/Ascend/cann"),
        "journal": Section(0, f"{STARTED + 1}.016 n4 atlas-serving-launch[958]: Load weight end. avail mem=58.00 GB\n"
                              f"{STARTED + 2}.018 n4 atlas-serving-launch[958]: The server is fired up and ready"),
        "versions": Section(0, VERSIONS),
        "models": Section(0, models()),
        "probe": Section(0, json.dumps({"port": 30000, "/health": 200, "/v1/models": 401})),
        "hang": hang(sglang(), sglang(tokens=8, itl=31), DONE),
        "npu_procs": Section(0, npu_procs()),
    }


ENGINE = {"pid": 958, "name": "python3", "cmdline": "/opt/atlas/engines/sglang-standin-0.5.6/bin/python -m "
          "sglang.launch_server", "npus": [0], "unit": "atlas-serving.service", "engine": True}
STRANGER = {"pid": 5000, "name": "python3", "cmdline": "python3 train.py", "npus": [1], "unit": "session-3.scope",
            "engine": False}


def npu_procs(*processes: dict) -> str:
    """The npu_procs section: the node's scan (module_utils npu_procs); default the serving engine on NPU 0."""
    return json.dumps({"processes": list(processes or [ENGINE]), "unreadable": []})


NO_PROCESS = Section(0, json.dumps({"processes": [], "unreadable": []}))
INACTIVE = Section(0, "MainPID=0\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\n"
                      "NRestarts=0")


def ev(**changes: Section | None) -> Evidence:
    sections = healthy()
    for name, sec in changes.items():
        if sec is None:
            sections.pop(name, None)
        else:
            sections[name] = sec
    return Evidence("atlas-n4", sections)


@pytest.fixture(scope="module")
def ctx() -> checks.Context:
    # the evidence is a lab node's (the SGLang stand-in): the lab inventory's compatibility rows
    return checks.default_context(LAB_TABLES)


def test_healthy_evidence_has_no_findings(ctx):
    assert checks.diagnose(ev(), ctx) == []


def journal_line(offset: int, text: str) -> str:
    return f"{STARTED + offset}.5 atlas-n4 atlas-serving-launch[958]: {text}"


CASES = [
    # (id, evidence changes, check, severity, text in message or evidence)
    ("no npu-smi", {"npu": Section(127, "npu-smi: command not found")}, "npu-visible", ERROR, "not installed"),
    ("driver unloaded", {"npu": Section(8, "The driver is not loaded.")}, "npu-visible", ERROR, "not loaded"),
    ("no device listed", {"npu": Section(0, "+---+\n| npu-smi 25.5.0 Version: 25.5.0 |\n")}, "npu-visible",
     ERROR, "lists no NPU"),
    ("health critical", {"npu": Section(0, npu_text(health=("OK", "Critical", "OK", "OK")))}, "npu-health",
     ERROR, "NPU 1 Critical"),
    ("health warning", {"npu": Section(0, npu_text(health=("Warning", "OK", "OK", "OK")))}, "npu-health",
     WARNING, "NPU 0 Warning"),
    ("tp above npus", {"args": Section(0, args_text(extra=("--tp-size", "8")))}, "npu-count", ERROR,
     "4 usable NPU(s) for tensor parallel size 8"),
    ("tp above visible", {"env": Section(0, "ASCEND_RT_VISIBLE_DEVICES=0"),
                          "args": Section(0, args_text(extra=("--tp-size", "2")))}, "npu-count", ERROR,
     "ASCEND_RT_VISIBLE_DEVICES=0"),
    ("hbm over sglang fraction", {"npu": Section(0, npu_text(used=(3318, 30000, 3318, 3318)))}, "hbm", ERROR,
     "NPU 1 30000/32768"),
    ("hbm over vllm default 0.9", {"record": Section(0, record(engine="vllm", engine_release="vllm-ascend-0.11.0")),
                                   "args": Section(0, args_text("vllm")),
                                   "npu": Section(0, npu_text(used=(30000, 3318, 3318, 3318)))}, "hbm", ERROR,
     "--gpu-memory-utilization default 0.9"),
    ("service failed", {"service": Section(0, "MainPID=0\nLoadState=loaded\nActiveState=failed\nSubState=failed\n"
                                              "Result=exit-code\nNRestarts=5")}, "service", ERROR, "failed"),
    ("crash loop at start limit", {
        "service": Section(0, "MainPID=0\nLoadState=loaded\nActiveState=failed\nSubState=failed\n"
                              "Result=signal\nNRestarts=4"),
        "journal": Section(0, journal_line(30, "atlas-serving.service: Start request repeated too quickly."))},
     "service", ERROR, "systemd stopped restarting it (start limit hit)"),
    ("key in sglang config file", {"env": Section(0, "SGLANG_SET_CPU_AFFINITY=1"),
                                   "args": Section(0, args_text(extra=(
                                       "--config", "/etc/atlas/serving/releases/r1/atlas-serving.keys.yaml"))),
                                   "probe": Section(0, json.dumps({"port": 30000, "/health": 200, "/v1/models": 200}))},
     "api-key", ERROR, "without it is served"),
    ("service not installed", {"service": Section(0, "LoadState=not-found\nActiveState=inactive")}, "service",
     ERROR, "not installed"),
    ("health 503", {"probe": Section(0, json.dumps({"port": 30000, "/health": 503, "/v1/models": 401}))},
     "service", ERROR, "answers 503"),
    ("cann env missing", {"environ": Section(0, "")}, "cann-env", ERROR, "not sourced"),
    ("device id list", {"env": Section(0, "ASCEND_DEVICE_ID=0,1,2,3\nSGLANG_API_KEY=<redacted>")}, "env-file",
     ERROR, "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"),
    ("fictional variable", {"env": Section(0, "VLLM_USE_CANN=1\nSGLANG_API_KEY=<redacted>")}, "env-file", ERROR,
     "`VLLM_USE_CANN` is fictional"),
    ("fictional quoted", {"env": Section(0, 'ASCEND_HBM_CACHE_ENABLE="1"')}, "env-file", ERROR,
     "ASCEND_HBM_CACHE_ENABLE"),
    ("env file world readable", {"modes": Section(0, "/etc/atlas/serving/atlas-serving.env 644 root root")},
     "env-file-mode", ERROR, "not 0600 root:root"),
    ("env file other owner", {"modes": Section(0, "/etc/atlas/serving/atlas-serving.env 600 atlas-serving root")},
     "env-file-mode", ERROR, "atlas-serving:root"),
    ("args world readable", {"modes": Section(0, "/etc/atlas/serving/atlas-serving.args 644 root atlas-serving")},
     "args-file-mode", ERROR, "readable by everyone"),
    ("key not enforced", {"probe": Section(0, json.dumps({"port": 30000, "/health": 200, "/v1/models": 200}))},
     "api-key", ERROR, "without it is served"),
    ("no key", {"env": Section(0, "SGLANG_SET_CPU_AFFINITY=1"), "args": Section(0, args_text()),
                "probe": Section(0, json.dumps({"port": 30000, "/health": 200, "/v1/models": 200}))},
     "api-key", INFO, "no API key"),
    ("npu oom now", {"journal": Section(0, journal_line(5, "RuntimeError: NPU out of memory. Tried to allocate"))},
     "oom", ERROR, "torch_npu allocator"),
    ("cuda oom", {"journal": Section(0, journal_line(5, "torch.OutOfMemoryError: CUDA out of memory."))},
     "oom", ERROR, "since the service last started"),
    ("vllm kv", {"journal": Section(0, journal_line(5, "ValueError: No available memory for the cache blocks. "))},
     "oom", ERROR, "vLLM KV cache"),
    ("sglang static", {"journal": Section(0, journal_line(
        5, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.85"))},
     "oom", ERROR, "SGLang static memory"),
    ("oom killer", {"journal": Section(0, journal_line(
        5, "atlas-serving.service: Failed with result 'oom-kill'."))}, "oom", ERROR, "kernel OOM killer"),
    ("oom before restart", {"journal": Section(0, journal_line(-60, "RuntimeError: NPU out of memory."))},
     "oom", WARNING, "before the last start"),
    ("sglang retract", {"journal": Section(0, journal_line(5, "Decode out of memory. Try to lower your batch size."))},
     "oom", WARNING, "SGLang retract"),
    ("driver installed, not running", {"board": Section(0, "NPU ID : 0\nSoftware Version : 24.1.rc1\n"
                                                        "Firmware Version : 7.1.0.6.220\n")},
     "reboot-pending", WARNING, "driver 25.5.0 is installed but 24.1.rc1 runs"),
    ("driver not cann's pair", {"versions": Section(0, VERSIONS.replace("25.5.0", "24.1.rc1"))}, "versions",
     WARNING, "driver 24.1.rc1"),
    ("engine needs other cann", {"record": Section(0, record(engine="vllm", engine_release="vllm-ascend-0.11.0")),
                                 "args": Section(0, args_text("vllm"))}, "versions", ERROR, "needs CANN 8.3.RC2"),
    ("no cann at all", {"record": Section(0, record(engine="vllm", engine_release="vllm-ascend-0.11.0")),
                        "args": Section(0, args_text("vllm")), "environ": None,
                        "versions": Section(0, "== /usr/local/Ascend/driver/version.info\nVersion=25.5.0\n")},
     "versions", ERROR, "no CANN toolkit"),
    ("pinned cann script gone", {"record": Section(0, record(cann="9.1.0")), "cann_pin": Section(0,
        "present /usr/local/Ascend/cann-9.1.0/set_env.sh\nmissing /usr/local/Ascend/nnal/atb/9.1.0/atb/set_env.sh")},
     "cann-pin", ERROR, "release r1 pins CANN 9.1.0 but /usr/local/Ascend/nnal/atb/9.1.0/atb/set_env.sh is missing"),
    ("driver outside the pinned cann", {"record": Section(0, record(cann="8.5.0")), "cann_pin": Section(0, ""),
                                        "versions": Section(0, VERSIONS.replace("25.5.0", "26.0.RC1"))},
     "cann-pin", ERROR, "driver 26.0.RC1 is outside the drivers CANN 8.5.0 runs on (25.0.X to 25.5.X"),
    ("stamp missing", {"models": Section(0, models(stamp=None))}, "model-stamp", ERROR, "no verification stamp"),
    ("file changed", {"models": Section(0, models(files={
        "config.json": {"size": 10, "mtime_ns": 5, "ino": 7},
        "model.safetensors": {"size": 99, "mtime_ns": 999, "ino": 8}}))}, "model-stamp", ERROR, "model.safetensors"),
    ("file added", {"models": Section(0, models(files=dict(VERIFIED, **{"evil.py": {"size": 1, "mtime_ns": 1,
                                                                                    "ino": 9}})))},
     "model-stamp", ERROR, "evil.py (not verified)"),
    ("file gone", {"models": Section(0, models(files={"config.json": VERIFIED["config.json"]}))}, "model-stamp",
     ERROR, "model.safetensors (gone)"),
    ("link missing", {"models": Section(0, "[]")}, "model", ERROR, "is missing"),
    ("engine left after a stop", {"service": INACTIVE}, "leftover-processes", ERROR,
     "atlas-serving.service is inactive but 1 process(es) still hold NPUs or run an engine"),
    ("engine left, named", {"service": INACTIVE}, "leftover-processes", ERROR,
     "pid 958 (python3: /opt/atlas/engines/sglang-standin-0.5.6/bin/python -m sglang.launch_server) holds NPU 0, "
     "unit atlas-serving.service, an engine process"),
    ("api server left without a device", {"service": INACTIVE, "npu_procs": Section(0, npu_procs(
        dict(ENGINE, npus=[])))}, "leftover-processes", ERROR, "holds no NPU"),
    ("process npu-smi lists after a stop", {"service": INACTIVE, "npu_procs": NO_PROCESS,
                                            "npu": Section(0, npu_text(procs={2: [(7001, "python3", 52000)]}))},
     "leftover-processes", ERROR, "pid 7001 (python3) holds NPU 2 (52000 MB), in no systemd unit (listed by npu-smi "
                                  "only)"),
    ("zombie hbm", {"service": INACTIVE, "npu_procs": NO_PROCESS,
                    "npu": Section(0, npu_text(used=(3318, 30000, 3318, 3318)))}, "leftover-processes", ERROR,
     "HBM is held with no process on NPU 1"),
    ("stranger on an npu", {"npu_procs": Section(0, npu_procs(ENGINE, STRANGER))}, "leftover-processes", ERROR,
     "1 process(es) outside atlas-serving.service hold NPUs while it runs"),
    ("rendered for old version", {"record": Section(0, record(model_version="old999"))}, "model", WARNING, "old999"),
    ("instance hung", {"hang": hang(sglang(), sglang(), MISSED)}, "instance-hung", ERROR,
     "engine hung at http://127.0.0.1:30000: no progress counter moved in 10.0 s"),
    ("instance slow", {"hang": hang(sglang(), sglang(itl=35), MISSED)}, "instance-hung", WARNING,
     "overloaded, not hung"),
    ("sglang without --enable-metrics, completion missed", {"hang": hang(NO_METRICS, NO_METRICS, MISSED)},
     "instance-hung", WARNING, "SGLang serves /metrics only with --enable-metrics"),
    ("sglang without --enable-metrics, completion fine", {"hang": hang(NO_METRICS, NO_METRICS, DONE)},
     "instance-hung", INFO, "the completion finished in 0.3 s; the engine exports no progress counter"),
]


@pytest.mark.parametrize(("changes", "check", "severity", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fault_is_diagnosed(ctx, changes, check, severity, text):
    findings = checks.diagnose(ev(**changes), ctx)
    match = [f for f in findings if f.check == check and f.severity == severity]
    assert match, f"no {severity} {check} finding in {findings}"
    assert any(text in f.message or text in f.evidence for f in match), match
    assert all(f.fix and f.evidence and f.host == "atlas-n4" for f in findings)


# (id, hang section, severity or None for no finding)
HANG_VERDICTS = [
    ("ok: the completion came back", hang(sglang(), sglang(), DONE), None),
    ("idle: nothing to do", hang(sglang(running=0), sglang(running=0),
                                 {"status": 401, "seconds": 0.0, "error": "HTTP 401", "deadline_s": 10.0}), None),
    ("slow", hang(sglang(), sglang(tokens=9), MISSED), WARNING),
    ("hung", hang(sglang(running=3), sglang(running=3), MISSED), ERROR),
    ("no metrics, missed", hang(NO_METRICS, NO_METRICS, MISSED), WARNING),
    ("no metrics, completed", hang(NO_METRICS, NO_METRICS, DONE), INFO),
    ("skipped: a non-head rank", Section(0, '{"skipped": "rank 1 of ds: checked on its entry atlas-n4"}'), None),
    ("skipped: no record", Section(0, '{"skipped": "no service record: [Errno 2]"}'), None),
    ("not JSON", Section(0, "Traceback (most recent call last):"), None),
    ("samples of the wrong shape", Section(0, json.dumps({"completion": MISSED, "before": "x", "after": [1]})),
     None),
    ("failed section", Section(1, json.dumps({"completion": MISSED, "before": None, "after": None})), None),
    ("a counter that is not a number", Section(0, json.dumps({"completion": MISSED, "before": sglang(),
                                                              "after": dict(sglang(), progress={"x": "7"})})), None),
    ("a completion without its seconds", Section(0, json.dumps({"completion": {"status": None}, "before": None,
                                                                "after": sglang()})), None),
]


@pytest.mark.parametrize(("section", "severity"), [c[1:] for c in HANG_VERDICTS], ids=[c[0] for c in HANG_VERDICTS])
def test_hang_verdict_severity(ctx, section, severity):
    found = checks.check_instance_hung(ev(hang=section), ctx)
    assert [f.severity for f in found] == ([severity] if severity else [])
    assert all(f.check == "instance-hung" for f in found)


def test_a_hung_instance_shows_both_samples_and_names_the_recover_playbook(ctx):
    found = checks.check_instance_hung(ev(hang=hang(sglang(running=2), sglang(running=2), MISSED, INSTANCE)), ctx)
    [finding] = found
    assert finding.message.startswith("engine hung at http://127.0.0.1:30000 (instance ds, entry atlas-n4, ranks "
                                      "atlas-n4, atlas-n5): no progress counter moved in 10.0 s")
    counters = ("sglang:num_running_reqs=2 sglang:num_queue_reqs=0 sglang:generation_tokens_total=7 "
                "sglang:num_requests_total=1 sglang:time_to_first_token_seconds_count=2 "
                "sglang:inter_token_latency_seconds_count=30")
    assert finding.evidence == (f"GET /metrics on the node 10 s apart: before {counters}; after {counters}; "
                                "POST /v1/completions (1 token, deadline 10.0 s) did not finish within its 10 s "
                                "deadline")
    assert finding.fix == progress.FIXES["hung"]
    assert finding.fix.endswith("restart every rank of the instance: ansible-playbook -i INV playbooks/recover.yml")


def test_leftovers_fix_names_their_units_and_hccl_wait(ctx):
    stopped = checks.check_leftover_processes(ev(service=INACTIVE, npu_procs=Section(0, npu_procs(ENGINE, STRANGER))),
                                              ctx)
    assert len(stopped) == 1 and stopped[0].check == "leftover-processes"
    assert stopped[0].fix.startswith("stop them: `systemctl stop atlas-serving.service` and `kill 5000`")
    assert "HCCL needs about 10 s" in stopped[0].fix and "EJ0001" in stopped[0].fix
    running = checks.check_leftover_processes(ev(npu_procs=Section(0, npu_procs(ENGINE, STRANGER))), ctx)
    assert "pid 5000" in running[0].evidence and "pid 958" not in running[0].evidence
    assert "systemctl stop" not in running[0].fix and "`kill 5000`" in running[0].fix


def test_zombie_hbm_fix_is_a_reboot(ctx):
    found = checks.check_leftover_processes(ev(service=INACTIVE, npu_procs=NO_PROCESS,
                                               npu=Section(0, npu_text(used=(3318, 30000, 3318, 3318)))), ctx)
    assert "NPU 1 30000/32768 MB" in found[0].evidence
    assert found[0].fix.startswith("HBM held with no process left on NPU 1 is a zombie engine (vllm-ascend #9888)")


@pytest.mark.parametrize("changes", [
    {"service": INACTIVE, "npu_procs": NO_PROCESS},  # stopped cleanly
    {"npu_procs": Section(0, npu_procs(ENGINE, dict(ENGINE, pid=959, npus=[1, 2, 3])))},  # its own ranks/workers
    {"npu": Section(0, npu_text(procs={1: [(7001, "python3", 100)]}))},  # running; a pid the scan did not see
    {"npu_procs": None},  # not gathered (an older node script, a cut-off output)
    {"npu_procs": Section(1, '{"error": "cannot list /proc"}')},
])
def test_no_leftover_finding_when_the_npus_are_the_units(ctx, changes):
    assert checks.check_leftover_processes(ev(**changes), ctx) == []


def test_unknown_variable_in_env_file_names_the_release(ctx):
    findings = checks.check_env_file(ev(env=Section(0, "MY_TUNING=1")), ctx)
    assert [f.severity for f in findings] == [ERROR]
    assert "sglang-0.5.6" in findings[0].message


def test_missing_sections_give_no_findings(ctx):
    """A host whose gather stopped early is judged on what came back, without crashing."""
    empty = Evidence("h", {})
    assert checks.diagnose(empty, ctx) == []


def test_findings_never_carry_a_key():
    key = "sk-abcdef0123456789"
    f = Finding("h", "oom", ERROR, f"--api-key {key}", f"server_args=ServerArgs(api_key='{key}', port=1)",
                f"VLLM_API_KEY={key}")
    assert key not in json.dumps(f.to_dict())
    assert "api_key=None" in redact("ServerArgs(api_key=None, x=1)")


def test_finding_rejects_unknown_severity():
    with pytest.raises(ValueError, match="severity"):
        Finding("h", "x", "fatal", "m", "e", "f")


# (id, text, the keys it holds, what must stay)
REDACTIONS = [
    ("flag and value", "args: --api-key k1 --port 8000", ["k1"], "--port 8000"),
    ("flag=value", "vllm serve --api-key=k1 --port 8000", ["k1"], "--port 8000"),
    ("single-quoted", "--api-key 'k1 x' --port 1", ["k1"], "--port 1"),
    ("double-quoted", '--api-key "k1" --host 0.0.0.0', ["k1"], "--host 0.0.0.0"),
    ("=single-quoted", "--api-key='k1' x", ["k1"], " x"),
    ("several keys", "--api-key k1 k2 'k3' --port 1", ["k1", "k2", "k3"], "--port 1"),
    ("several keys at the end", "cmd --api-key k1 k2", ["k1", "k2"], "cmd --api-key"),
    ("args file lines", "bin/vllm\n--api-key\nk1\nk2\n--port\n8000", ["k1", "k2"], "--port\n8000"),
    ("env", "VLLM_API_KEY=k1\nHF_HUB_OFFLINE=1", ["k1"], "HF_HUB_OFFLINE=1"),
    ("env quoted", 'SGLANG_API_KEY="k1 k2"', ["k1", "k2"], "SGLANG_API_KEY="),
    ("env export", "export OPENAI_API_KEY='k1'", ["k1"], "export"),
    ("yaml", "api_key: k1\nport: 8000", ["k1"], "port: 8000"),
    ("yaml prefixed name", "serving_api_key: k1", ["k1"], "serving_api_key:"),
    ("yaml quoted", 'api_key: "k1"', ["k1"], "api_key:"),
    ("yaml flow list", "api_key: [k1, k2]\nport: 1", ["k1", "k2"], "port: 1"),
    ("yaml block list", "api_key:\n  - k1\n  - k2\nport: 1", ["k1", "k2"], "port: 1"),
    ("json", '{"api_key": "k1", "port": 1}', ["k1"], '"port": 1'),
    ("json list", '{"api_key": ["k1", "k2"], "port": 1}', ["k1", "k2"], '"port": 1'),
    ("python repr", "ServerArgs(api_key='k1', port=1)", ["k1"], "port=1"),
    ("python repr list", "non-default args: {'api_key': ['k1', 'k2'], 'port': 1}", ["k1", "k2"], "'port': 1"),
    ("bearer", "curl -H 'Authorization: Bearer k1' http://x", ["k1"], "http://x"),
]


@pytest.mark.parametrize(("text", "keys", "kept"), [r[1:] for r in REDACTIONS], ids=[r[0] for r in REDACTIONS])
def test_redact_hides_a_key_however_it_is_written(text, keys, kept):
    text = text.replace("k1", "sk-one").replace("k2", "sk-two").replace("k3", "sk-three")
    out = redact(text)
    for key in keys:
        assert key.replace("k1", "sk-one").replace("k2", "sk-two").replace("k3", "sk-three") not in out, out
    assert "<redacted>" in out
    assert kept in out
    assert redact(out) == out


@pytest.mark.parametrize("text", ["ServerArgs(api_key=None, x=1)", "api_key: null", "--port 8000 --host h",
                                  "the api key is set", "VLLM_API_KEY="])
def test_redact_leaves_text_without_a_key_alone(text):
    assert redact(text) == text
# --- bundle trust (inventory vars, judged on the controller) ---------------------------------------


@pytest.mark.parametrize("hostvars, severity, words", [
    ({"atlas_bundle_allow_unsigned": True}, "warning", "UNSIGNED bundles are accepted"),
    ({"bundle_allow_unsigned": "yes"}, "warning", "UNSIGNED bundles are accepted"),
    ({}, "error", "is empty"),
    ({"atlas_bundle_trusted_fingerprints": ["DEADBEEF"]}, "error", "not a full 40-hex fingerprint"),
])
def test_bundle_trust_findings(hostvars, severity, words):
    found = checks.check_bundle_trust("n1", hostvars)
    assert [(f.check, f.severity) for f in found] == [("bundle-signature", severity)] and words in found[0].message
    assert found[0].fix


def test_bundle_trust_pinned_is_quiet_and_findings_reach_the_report():
    assert checks.check_bundle_trust("n1", {"atlas_bundle_trusted_fingerprints": ["AB" * 20]}) == []
    from atlasctl.doctor import report

    extra = checks.check_bundle_trust("n1", {"atlas_bundle_allow_unsigned": True})
    result = report.build(["n1"], {}, {}, None, 0.0, extra=extra)
    assert [f.check for f in result.for_host("n1")] == ["bundle-signature"]


# --- a container release (docs/containers.md) ---------------------------------------------------

IMAGE_ID = "9e" * 32
CID = "c0" * 32


def container_args(npus=(0,)) -> str:
    argv = CONTAINER.run_argv({
        "podman": "/usr/bin/podman", "name": "atlas-serving", "image_id": IMAGE_ID, "npus": list(npus),
        "model_source": MODEL_DIR, "model_path": "/var/lib/atlas/models/tiny/current",
        "env_file": "/etc/atlas/serving/releases/r1/atlas-serving.env", "uid": 990, "gid": 990, "device_gid": 1000,
        "home": "/var/lib/atlas/serving", "shm_size": "1g", "entrypoint": ["python3"],
        "command": ["-m", "sglang.launch_server", "--model-path", "/var/lib/atlas/models/tiny/current",
                    "--tp-size", "1", "--mem-fraction-static", "0.85", "--port", "30000"]})
    return "#\n# Ansible managed\n#\n" + "\n".join(argv)


def inspect(devices=("/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"), driver=True,
            image=IMAGE_ID) -> Section:
    mounts = [{"Type": "bind", "Source": MODEL_DIR, "Destination": "/var/lib/atlas/models/tiny/current", "RW": False}]
    if driver:
        mounts.append({"Type": "bind", "Source": "/usr/local/Ascend/driver",
                       "Destination": "/usr/local/Ascend/driver", "RW": False})
    else:
        mounts.append({"Type": "bind", "Source": "/usr/local/Ascend/driver/lib64",
                       "Destination": "/usr/local/Ascend/driver/lib64", "RW": False})
    return Section(0, json.dumps([{"Id": CID, "Image": image, "Mounts": mounts,
                                   "HostConfig": {"Devices": [{"PathOnHost": d, "PathInContainer": d}
                                                              for d in devices]}}]))


IN_CONTAINER = dict(ENGINE, pid=4321, cmdline="python3 -m sglang.launch_server", unit=f"libpod-{CID}.scope",
                    engine=False)


def container_ev(**changes: Section | None) -> Evidence:
    base = {"record": Section(0, record(runtime="container", image="sglang", image_id=IMAGE_ID)),
            "args": Section(0, container_args()), "container": inspect(),
            "environ": Section(0, ""),  # podman's environment: the image's CANN is inside the container
            "npu_procs": Section(0, npu_procs(IN_CONTAINER))}
    return ev(**(base | changes))


def test_a_healthy_container_release_has_no_findings(ctx):
    assert checks.diagnose(container_ev(), ctx) == []


@pytest.mark.parametrize("changes, check, text", [
    ({"container": inspect(devices=("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"))},
     "container-devices", "the container lacks /dev/davinci0 that its release gives it"),
    ({"container": inspect(driver=False)}, "container-driver-mount",
     "/usr/local/Ascend/driver is not mounted in the container, not the whole directory read-only (only "
     "/usr/local/Ascend/driver/lib64: a partial driver mount breaks HCCL)"),
    ({"container": inspect(image="ab" * 32)}, "container-image", f"not {IMAGE_ID}, the image of its release"),
    ({"container": Section(125, "Error: no such container atlas-serving")}, "container",
     "is active but its container atlas-serving cannot be inspected"),
    ({"args": Section(0, container_args()), "npu_procs": Section(0, npu_procs(dict(IN_CONTAINER, unit="libpod-"
                                                                                   + "d1" * 32 + ".scope")))},
     "leftover-processes", "outside atlas-serving.service hold NPUs"),
    ({"args": Section(0, container_args().replace("--tp-size\n1", "--tp-size\n2"))}, "npu-count",
     "of the container's --device list (davinci0) for tensor parallel size 2"),
])
def test_a_container_fault_is_diagnosed_with_evidence_and_fix(ctx, changes, check, text):
    found = [f for f in checks.diagnose(container_ev(**changes), ctx) if f.check == check]
    assert found and any(text in f.message or text in f.evidence for f in found), checks.diagnose(
        container_ev(**changes), ctx)
    assert all(f.fix and f.evidence for f in found)


def test_the_container_check_runs_only_for_an_active_container_release(ctx):
    assert checks.check_container(container_ev(service=INACTIVE, container=None), ctx) == []
    assert checks.check_container(ev(container=Section(0, "")), ctx) == []  # a venv release: nothing gathered


def test_the_gathered_script_inspects_only_where_the_record_says_container():
    from atlasctl.doctor import gather

    snippet = dict(gather.snippets())["container"]
    assert snippet.startswith("grep -q '\"runtime\": \"container\"' /etc/atlas/serving/atlas-serving.json")
    assert snippet.endswith("|| exit 0; podman inspect --type container atlas-serving")


def test_the_container_section_runs_podman_only_on_a_container_node(tmp_path):
    import os
    import subprocess

    from atlasctl.doctor import gather
    from atlasctl.layout import Layout

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/podman.log\necho '[]'\n")
    (bin_dir / "podman").chmod(0o755)
    layout = Layout.of({"serving_config_dir": str(tmp_path / "etc")})
    (tmp_path / "etc").mkdir()
    script = gather.script((("container", dict(gather.snippets(layout))["container"]),))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for runtime, calls in (("venv", 0), ("container", 1)):
        (tmp_path / "etc/atlas-serving.json").write_text(record(runtime=runtime) + "\n")
        evidence = gather.split_sections("n", subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                                                             text=True, timeout=30).stdout, layout)
        log = tmp_path / "podman.log"
        assert (len(log.read_text().splitlines()) if log.exists() else 0) == calls
        assert evidence.section("container").rc == 0
    assert log.read_text().strip() == "inspect --type container atlas-serving"


# --- npu-compatibility: every NPU's board (npu-smi info -t board -i <id>), read by module_utils npu_smi ----------

# Real 910B prints (tests/fixtures/vendor/npu_smi/SOURCES.md): `\t<key padded to 30> : <value>` lines.
NPU_SMI_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "npu_smi"


def board_text(npu_id: int, fixture: str = "board_910b_ok.txt", **fields: str) -> str:
    """One NPU's board print (a real one with its NPU ID and ``fields``, e.g. Compatibility="UNKNOWN", set)."""
    text = (NPU_SMI_FIXTURES / fixture).read_text()
    for key, value in {"NPU ID": str(npu_id), **fields}.items():
        text, count = re.subn(rf"(?m)^(\t{re.escape(key)} *: ).*$", lambda m, v=value: m.group(1) + v, text)
        assert count == 1, key
    return text.rstrip("\n")


def boards_section(*prints: str) -> Section:
    """The board section as the node's loop prints it: each NPU's print, then a blank line."""
    return Section(0, "".join(f"{p}\n\n" for p in prints).rstrip("\n"))


EIGHT_NPUS = Section(0, npu_text(health=("OK",) * 8, used=(3318,) * 8))


def compat(*prints: str, **changes: Section | None) -> list[Finding]:
    return checks.check_npu_compatibility(ev(npu=EIGHT_NPUS, board=boards_section(*prints), **changes), None)


def test_the_board_fixture_is_the_real_tab_prefixed_layout():
    assert board_text(3).startswith("\tNPU ID                         : 3\n")


def test_eight_compatible_boards_are_one_ok_line_naming_the_npus(ctx):
    found = compat(*(board_text(i) for i in range(8)))
    assert [(f.check, f.severity) for f in found] == [("npu-compatibility", INFO)]
    assert found[0].message == ("OK: driver 24.1.rc2 and firmware 7.5.0.1.129 compatible on all 8 NPU(s) "
                                "(NPU 0, 1, 2, 3, 4, 5, 6, 7)")
    assert "npu-smi info -t board" in found[0].evidence
    everything = checks.diagnose(ev(npu=EIGHT_NPUS, board=boards_section(*(board_text(i) for i in range(8)))), ctx)
    assert [f.severity for f in everything if f.check == "npu-compatibility"] == [INFO]


def test_a_nok_board_is_an_error_naming_the_npu_and_the_fix():
    found = compat(*(board_text(i, "board_910b_nok.txt" if i == 5 else "board_910b_ok.txt") for i in range(8)))
    assert {f.severity for f in found} == {ERROR}
    [nok] = [f for f in found if "Compatibility NOK" in f.message]
    assert nok.message.startswith("NPU 5: npu-smi info -t board says Compatibility NOK: the firmware does not match "
                                  "the driver (driver 24.1.rc2 (Software Version), firmware 7.1.0.6.220")
    assert nok.fix.startswith("install the firmware of the driver's own HDK release (Ascend-hdk-910b-npu-firmware")
    assert nok.fix.endswith("then reboot") and "Fix:" not in nok.message
    # NPU 5's firmware is not the others': the pair differs too
    assert any("do not run the same driver and firmware" in f.message for f in found)


def test_an_unknown_board_is_a_warning():
    found = compat(*(board_text(i, Compatibility="UNKNOWN") if i == 2 else board_text(i) for i in range(8)))
    assert [f.severity for f in found] == [WARNING]
    assert found[0].message.startswith("NPU 2: npu-smi info -t board says Compatibility UNKNOWN")
    assert "Ascend-hdk-910b-npu-firmware" in found[0].fix


def test_boards_on_different_drivers_are_an_error():
    found = compat(*(board_text(i, **({"Software Version": "24.1.rc1"} if i >= 4 else {})) for i in range(8)))
    assert [f.severity for f in found] == [ERROR]
    assert "the NPUs do not run the same driver and firmware (NPU 0, 1, 2, 3: driver 24.1.rc2" in found[0].message
    assert "NPU 4, 5, 6, 7: driver 24.1.rc1" in found[0].message
    assert "then reboot" in found[0].fix


@pytest.mark.parametrize(("board", "words", "fix"), [
    ({"Compatibility": "NOT SUPPORT"}, "npu-smi was not run as root", "root"),
    (None, "NPU 6: npu-smi info -t board failed", "npu-smi info -t board -i <id>"),
])
def test_a_board_not_judged_is_a_warning_with_a_fix(board, words, fix):
    prints = [board_text(i, **(board or {})) if i == 6 and board else board_text(i) for i in range(8)]
    if board is None:
        prints[6] = "npu-smi info -t board -i 6 failed (rc 2)"  # what the node's loop prints in its place
    found = compat(*prints)
    assert [f.severity for f in found] == [WARNING]
    assert words in found[0].message and fix in found[0].fix


def test_no_board_read_gives_no_compatibility_finding():
    assert compat() == []
    assert checks.check_npu_compatibility(ev(npu=EIGHT_NPUS, board=Section(127, "npu-smi: command not found")),
                                          None) == []
    assert checks.check_npu_compatibility(ev(npu=EIGHT_NPUS, board=None), None) == []


def test_the_reboot_check_reads_the_first_npus_board():
    section = boards_section(board_text(0, **{"Software Version": "24.1.rc1"}), board_text(1))
    found = checks.check_reboot_pending(ev(board=section), None)
    assert [f.check for f in found] == ["reboot-pending"] and "24.1.rc1 runs" in found[0].message
