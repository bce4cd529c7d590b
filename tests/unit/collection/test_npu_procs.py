"""NPUs free before a start (module_utils/npu_procs.py and the module atlas.serving.npu_free): fake /proc
trees (fd links to /dev/davinciN, cgroup files, exe links), npu-smi outputs with process rows and HBM,
the wait and its one failure message; the module entry through ansible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import npu_procs as procs
from ansible_collections.atlas.serving.plugins.module_utils import npu_smi

from atlasctl.doctor import gather
from support.npu_smi_text import SECTION_6

REPO = Path(__file__).resolve().parents[3]
ENGINES = "/opt/atlas/engines"
UNIT = "0::/system.slice/atlas-serving.service\n"

# The layout of a real `npu-smi info` (docs/ascend-platform.md section 6, as test_npu_smi.py holds it verbatim):
# its head, and its process table's rule, header and rule.
_REAL = SECTION_6.splitlines(keepends=True)
HEAD, PROCESS_HEAD, RULE = "".join(_REAL[:6]), "".join(_REAL[13:16]), _REAL[5]
DEVICE = """\
| {id}     910B3               | OK            | 101.8       43                0    / 0             |
| 0                         | 0000:{id:02X}:00.0  | 0           0    / 0          {used:<5}/ 65536         |
+===========================+===============+====================================================+
"""
NONE_ROW = "| No running processes found in NPU {id}                                                            |\n"
PROCESS_ROW = "| {id}       0                 | {pid:<14}| {name:<25}| {mb:<24}|\n"


def smi(used: tuple[int, ...] = (3318, 3314), rows: dict[int, list[tuple[int, str, int]]] | None = None,
        first: int = 0) -> str:
    """``npu-smi info`` of len(used) NPUs from id ``first``; ``rows``: {npu: [(pid, name, MB)]} in the process
    table."""
    rows = rows or {}
    ids = range(first, first + len(used))
    text = HEAD + "".join(DEVICE.format(id=i, used=u) for i, u in zip(ids, used, strict=True)) + PROCESS_HEAD
    for i in ids:
        lines = [PROCESS_ROW.format(id=i, pid=pid, name=name, mb=mb) for pid, name, mb in rows.get(i, [])]
        text += "".join(lines) or NONE_ROW.format(id=i)
        text += RULE
    return text


def info(**kw) -> dict:
    return npu_smi.parse_info(smi(**kw))


def fake_proc(root: Path, pid: int, *, comm: str = "python3", argv: tuple[str, ...] = ("/usr/bin/python3",),
              exe: str | None = "/usr/bin/python3.11", fds: dict[int, str] | None = None,
              cgroup: str = UNIT, fd_readable: bool = True) -> None:
    """/proc/<pid> as the kernel shows it: comm, cmdline (NUL-separated), exe and fd links, cgroup."""
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (d / "cgroup").write_text(cgroup)
    if exe is not None:
        (d / "exe").symlink_to(exe)
    for fd, target in (fds or {}).items():
        (d / "fd" / str(fd)).symlink_to(target)
    if not fd_readable:
        (d / "fd").rename(d / "fd-hidden")


def engine_argv(rank: str = "sglang-0.5.6") -> tuple[str, ...]:
    return (f"{ENGINES}/{rank}/bin/python", "-m", "sglang.launch_server", "--model-path", "/m")


# --- the /proc side -------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "npu"), [
    ("/dev/davinci0", 0), ("/dev/davinci15", 15), ("/dev/davinci_manager", None), ("/dev/devmm_svm", None),
    ("/dev/hisi_hdc", None), ("/dev/null", None), ("socket:[1234]", None), ("/dev/davinci", None), (None, None),
])
def test_only_the_numbered_davinci_devices_are_npus(target, npu) -> None:
    assert procs.npu_of(target) == npu


@pytest.mark.parametrize(("cgroup", "unit"), [
    (UNIT, "atlas-serving.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("0::/system.slice/docker-0123abcd.scope\n", "docker-0123abcd.scope"),
    ("0::/\n", None),
    ("0::/docker/0123abcd\n", None),
    ("12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/atlas-serving.service\n", "atlas-serving.service"),
    ("0::/system.slice/atlas-serving.service/payload\n", "atlas-serving.service"),
    ("", None),
])
def test_the_unit_comes_from_the_cgroup_file(cgroup, unit) -> None:
    assert procs.unit_of(cgroup) == unit


@pytest.mark.parametrize(("exe", "argv0", "engine"), [
    ("/usr/bin/python3.11", f"{ENGINES}/vllm-ascend-0.11.0/bin/python", True),  # a venv's python is a link
    (f"{ENGINES}/x/bin/vllm", "vllm", True),
    (f"{ENGINES}/x/bin/python3 (deleted)", "VLLM::EngineCore", True),  # exe replaced by an upgrade
    ("/usr/bin/python3.11", "VLLM::EngineCore", False),  # setproctitle replaced argv: exe and argv name nothing
    ("/usr/bin/python3.11", "/opt/atlas/engines-old/x/bin/python", False),
    (None, None, False),
])
def test_an_engine_process_runs_from_under_the_engines_root(exe, argv0, engine) -> None:
    assert procs.is_engine(exe, argv0, ENGINES) is engine


def test_scan_names_holders_and_engines_with_their_units(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, comm="systemd", argv=("/sbin/init",), exe="/usr/lib/systemd/systemd", cgroup="0::/\n")
    fake_proc(tmp_path, 4242, comm="python3", argv=engine_argv(),
              fds={0: "/dev/null", 3: "/dev/davinci_manager", 7: "/dev/davinci1", 8: "/dev/davinci0",
                   9: "/dev/davinci1", 10: "socket:[77]"})
    fake_proc(tmp_path, 4300, comm="python3", argv=engine_argv())  # the API server: no device yet
    fake_proc(tmp_path, 5000, comm="bash", argv=("bash",), exe="/usr/bin/bash",
              fds={3: "/dev/davinci2"}, cgroup="0::/user.slice/user-0.slice/session-3.scope\n")
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "77").mkdir()  # a process that exited while scanned: no cmdline
    got = procs.scan(ENGINES, proc_root=str(tmp_path))
    assert got["unreadable"] == []
    assert got["processes"] == [
        {"pid": 4242, "name": "python3", "cmdline": " ".join(engine_argv()), "npus": [0, 1],
         "unit": "atlas-serving.service", "engine": True},
        {"pid": 4300, "name": "python3", "cmdline": " ".join(engine_argv()), "npus": [],
         "unit": "atlas-serving.service", "engine": True},
        {"pid": 5000, "name": "bash", "cmdline": "bash", "npus": [2], "unit": "session-3.scope", "engine": False},
    ]


def test_scan_reports_processes_whose_fds_it_cannot_read(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, fd_readable=False)
    fake_proc(tmp_path, 11, argv=engine_argv(), fd_readable=False)
    got = procs.scan(ENGINES, proc_root=str(tmp_path))
    assert got["unreadable"] == [10, 11]
    assert [p["pid"] for p in got["processes"]] == [11]  # still an engine by its argv


def test_scan_of_a_real_process_holding_a_device(tmp_path: Path) -> None:
    """The real /proc: a child of the test holds <tmp>/davinci3 open (the /dev prefix is injectable)."""
    (tmp_path / "davinci3").write_text("")
    child = subprocess.Popen(["sleep", "30"], stdin=open(tmp_path / "davinci3"))  # noqa: SIM115
    try:
        found = [p for p in procs.scan(ENGINES, dev_prefix=str(tmp_path / "davinci"))["processes"]
                 if p["pid"] == child.pid]
    finally:
        child.kill()
        child.wait()
    assert len(found) == 1 and found[0]["npus"] == [3] and found[0]["name"] == "sleep"


def test_a_missing_proc_filesystem_is_named(tmp_path: Path) -> None:
    with pytest.raises(procs.NpuFreeError, match=r"cannot list .*nope: .*proc filesystem"):
        procs.scan(ENGINES, proc_root=str(tmp_path / "nope"))


# --- npu-smi and the scan together ------------------------------------------------------------


def test_npu_smi_rows_and_the_scan_merge_by_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4242, argv=engine_argv(), fds={5: "/dev/davinci0"})
    fake_proc(tmp_path, 6000, comm="VLLM::Worker_TP1", argv=("VLLM::Worker_TP1",))  # fds hidden from the scan
    scanned = procs.scan(ENGINES, proc_root=str(tmp_path))["processes"]
    rows = info(rows={0: [(4242, "python3", 52000)], 1: [(4242, "python3", 1000), (6000, "VLLM::Worker_TP1", 900),
                                                           (7000, "python3", 10)]})["processes"]
    merged = procs.holders(rows, scanned, proc_root=str(tmp_path), engines_root=ENGINES)
    assert [(p["pid"], p["npus"], p["memory_mb"], p["seen"]) for p in merged] == [
        (4242, [0, 1], 53000, ["proc", "npu-smi"]),
        (6000, [1], 900, ["npu-smi"]),
        (7000, [1], 10, ["npu-smi"]),
    ]
    assert merged[1]["unit"] == "atlas-serving.service" and merged[1]["name"] == "VLLM::Worker_TP1"
    assert merged[2]["unit"] is None and merged[2]["name"] == "python3"  # gone from /proc: npu-smi's name


@pytest.mark.parametrize(("devices", "pids"), [(None, [1, 2, 3]), ([0], [1, 3]), ([1], [2, 3]), ([5], [3])])
def test_leftovers_are_holders_of_the_npus_checked_and_engines_without_one(devices, pids) -> None:
    processes = [{"pid": 1, "npus": [0], "engine": True}, {"pid": 2, "npus": [1], "engine": False},
                 {"pid": 3, "npus": [], "engine": True}, {"pid": 4, "npus": [], "engine": False}]
    assert [p["pid"] for p in procs.leftovers(processes, devices)] == pids


@pytest.mark.parametrize(("used", "pct", "idle"), [
    (3318, 10, True), (6553, 10, True), (6554, 10, False), (58626, 10, False), (0, 0, True), (1, 0, False),
    (None, 10, False),
])
def test_an_npu_is_idle_at_or_below_the_share_of_its_hbm(used, pct, idle) -> None:
    assert procs.is_idle(used, 65536, pct) is idle


@pytest.mark.parametrize(("used", "total", "idle"), [
    (3318, 65536, True),  # a real idle 910B3 (docs/ascend-platform.md section 6)
    (3318, 32768, True),  # the same reservation on a 32 GB NPU (the lab's 910B4): 10.1 %
    (3318 + 27852, 32768, False),  # an engine left holding 85 % of it
    (9000, 65536, True), (9831, 65536, False),
])
def test_the_default_share_is_idle_on_64_and_32_gb_npus(used, total, idle) -> None:
    assert procs.is_idle(used, total) is idle


def test_an_npu_id_npu_smi_does_not_list_is_refused() -> None:
    with pytest.raises(procs.NpuFreeError, match=r"devices \[7\] are not listed by npu-smi info \(it lists \[0, 1\]\)"):
        procs.npu_states(info()["devices"], [0, 7])


# --- the wait ---------------------------------------------------------------------------------


class Clock:
    """A fake clock that sleep() advances; the reads of npu-smi come from a list (the last repeats)."""

    def __init__(self, outputs: list[str | None]):
        self.now, self.slept, self.outputs, self.reads = 100.0, [], outputs, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def read_info(self):
        text = self.outputs[min(self.reads, len(self.outputs) - 1)]
        self.reads += 1
        return (npu_smi.parse_info(text), None) if text is not None else (None, "npu-smi info exited 255: dcmi "
                                                                                 "module initialize failed")


def wait(tmp_path: Path, outputs: list[str | None], **kw) -> tuple[dict, Clock]:
    clk = Clock(outputs)
    kw = {"wait_s": 10, "poll_s": 1, **kw}
    result = procs.wait_free(clk.read_info, ENGINES, proc_root=str(tmp_path), clock=clk.clock, sleep=clk.sleep, **kw)
    return result, clk


def test_idle_npus_with_no_process_are_free_at_the_first_look(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, comm="systemd", argv=("/sbin/init",), cgroup="0::/\n")
    result, clk = wait(tmp_path, [smi()])
    assert result == {"free": True, "processes": [], "waited_s": 0.0, "unreadable": [],
                      "npus": [{"id": 0, "hbm_used_mb": 3318, "hbm_total_mb": 65536, "idle": True},
                               {"id": 1, "hbm_used_mb": 3314, "hbm_total_mb": 65536, "idle": True}]}
    assert clk.slept == []


def test_memory_that_drains_after_the_last_process_is_waited_for(tmp_path: Path) -> None:
    result, clk = wait(tmp_path, [smi(used=(52000, 3314)), smi(used=(30000, 3314)), smi()])
    assert result["free"] is True and result["waited_s"] == 2.0 and clk.slept == [1, 1]


def test_at_the_deadline_one_message_names_every_leftover_and_the_fix(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4242, argv=engine_argv(), fds={5: "/dev/davinci0"})
    fake_proc(tmp_path, 4300, argv=engine_argv())
    fake_proc(tmp_path, 5000, comm="bash", argv=("bash",), fds={3: "/dev/davinci1"},
              cgroup="0::/user.slice/user-0.slice/session-3.scope\n")
    result, clk = wait(tmp_path, [smi(used=(55000, 40000), rows={0: [(4242, "python3", 51000)]})], wait_s=3)
    assert result["free"] is False and result["waited_s"] == 3.0 and clk.slept == [1, 1, 1]
    assert [(p["pid"], p["npus"], p["unit"]) for p in result["processes"]] == [
        (4242, [0], "atlas-serving.service"), (4300, [], "atlas-serving.service"), (5000, [1], "session-3.scope")]
    msg = result["message"]
    assert msg.startswith("the NPUs are not free after 3.0 s: left running: pid 4242 (python3: "
                          f"{ENGINES}/sglang-0.5.6/bin/python -m sglang.launch_server --model-path /m) holds NPU 0 "
                          "(51000 MB), unit atlas-serving.service, an engine process; pid 4300 ")
    assert "pid 4300 (python3: " in msg and "holds no NPU, unit atlas-serving.service, an engine process" in msg
    assert "pid 5000 (bash: bash) holds NPU 1, unit session-3.scope;" not in msg  # the last one ends the list
    assert "pid 5000 (bash: bash) holds NPU 1, unit session-3.scope. " in msg
    assert "HBM not back to idle (<= 15 % of the NPU): NPU 0 55000/65536 MB, NPU 1 40000/65536 MB" in msg
    assert "Fix: stop them: `systemctl stop atlas-serving.service` and `kill 5000` (`kill -9 PID` for one " in msg
    assert "HCCL needs about 10 s before a new process can use the NPUs (EJ0001: \"Wait for 10s after killing " in msg
    assert "zombie" not in msg  # every busy NPU has a holder


def test_memory_held_with_no_process_is_a_zombie_engine_that_needs_a_reboot(tmp_path: Path) -> None:
    result, _ = wait(tmp_path, [smi(used=(3318, 61000))], wait_s=0)
    assert result["processes"] == [] and result["free"] is False
    msg = result["message"]
    assert "HBM not back to idle (<= 15 % of the NPU): NPU 1 61000/65536 MB. Fix: HBM held with no process left " \
           "on NPU 1 is a zombie engine (vllm-ascend #9888): only a reboot frees it; drain the node and reboot it." \
           in msg
    assert "systemctl" not in msg and "kill" not in msg


def test_only_the_npus_checked_count(tmp_path: Path) -> None:
    fake_proc(tmp_path, 5000, comm="bash", argv=("bash",), fds={3: "/dev/davinci1"})
    result, _ = wait(tmp_path, [smi(used=(3318, 40000))], devices=[0], wait_s=0)
    assert result["free"] is True and [n["id"] for n in result["npus"]] == [0] and result["processes"] == []


def test_an_npu_smi_that_fails_is_named_at_the_deadline(tmp_path: Path) -> None:
    result, _ = wait(tmp_path, [None], wait_s=2)
    assert result["free"] is False and result["npus"] == []
    assert "npu-smi info could not be read: npu-smi info exited 255: dcmi module initialize failed. Fix: make " \
           "npu-smi answer" in result["message"]


def test_a_poll_never_sleeps_past_the_deadline(tmp_path: Path) -> None:
    _, clk = wait(tmp_path, [smi(used=(60000, 3314))], wait_s=2, poll_s=1.5)
    assert clk.slept == [1.5, 0.5]


def test_the_file_runs_alone_and_prints_the_scan() -> None:
    """What atlasctl doctor sends to a node: this file's source and its driver, run with python3 -c."""
    source = gather.npu_procs_program()
    out = subprocess.run([sys.executable, "-I", "-c", source, ENGINES], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert set(got) == {"processes", "unreadable"} and isinstance(got["processes"], list)


# --- the module entry (ansible, local) --------------------------------------------------------


def _module(tmp_path: Path, **args) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c",
                           "local", "-e", f"ansible_python_interpreter={sys.executable}",
                           "-m", "atlas.serving.npu_free", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    status, result = proc.stdout.split(" => ", 1)
    return {**json.loads(result), "_status": status}


def fake_npu_smi(tmp_path: Path, text: str) -> Path:
    (tmp_path / "info.txt").write_text(text)
    exe = tmp_path / "npu-smi"
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = info ] && exec cat {tmp_path / 'info.txt'}\nexit 1\n")
    exe.chmod(0o755)
    return exe


def test_module_passes_on_idle_npus(tmp_path: Path) -> None:
    # NPUs 80 and 81: a process of this machine holding another /dev/davinciN (a lab node's) does not count
    text = smi(first=80)
    out = _module(tmp_path, npu_smi=str(fake_npu_smi(tmp_path, text)), engines_root=str(tmp_path / "engines"),
                  wait_s=0)
    assert "SUCCESS" in out["_status"] and out["free"] is True and out["changed"] is False, out
    assert [n["idle"] for n in out["npus"]] == [True, True] and out["processes"] == []


def test_module_fails_naming_an_engine_process_left_running(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    child = subprocess.Popen(["bash", "-c", f"exec -a {engines}/sglang-0.5.6/bin/python sleep 60"])
    try:
        out = _module(tmp_path, npu_smi=str(fake_npu_smi(tmp_path, smi(used=(3318, 50000), first=80))),
                      engines_root=str(engines), wait_s=1, poll_s=0.2)
    finally:
        child.kill()
        child.wait()
    assert "FAILED" in out["_status"] and out["free"] is False, out
    assert [p["pid"] for p in out["processes"]] == [child.pid] and out["processes"][0]["engine"] is True
    assert f"pid {child.pid} (sleep: {engines}/sglang-0.5.6/bin/python 60) holds no NPU" in out["msg"]
    assert "NPU 81 50000/65536 MB" in out["msg"]
    assert f"`kill {child.pid}`" in out["msg"] or "`systemctl stop " in out["msg"]  # the test's own unit, if any


def test_module_without_npu_smi_fails_at_once(tmp_path: Path) -> None:
    out = _module(tmp_path, npu_smi=str(tmp_path / "no-npu-smi"), engines_root="/opt/atlas/engines")
    assert "FAILED" in out["_status"] and out["free"] is False, out
    assert out["msg"] == (f"npu-smi not found ({tmp_path / 'no-npu-smi'}); the Ascend NPU driver is not installed: "
                          "the NPUs cannot be checked. Run the driver stage (playbooks/driver.yml) on this node, or "
                          "set npu_smi to the tool's path.")


def test_module_refuses_bad_inputs_naming_them(tmp_path: Path) -> None:
    out = _module(tmp_path, engines_root="/opt/atlas/engines", idle_hbm_pct=150)
    assert "FAILED" in out["_status"] and "idle_hbm_pct 150 is not a percentage" in out["msg"], out
