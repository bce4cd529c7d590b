"""The fault drills: one table, one row per fault, run in order on one converged lab.

Each row injects a fault, measures what the product did (observed outcome, client requests
that failed through the branch gateways while it happened, data lost), restores the fleet
and says whether what happened is what the product promises (expected outcome). The rows
run in table order; each leaves the fleet converged (every engine healthy, every backend
enabled at its gateway) for the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import yaml
from labtools import (
    ATLASCTL,
    BRANCH,
    ENV,
    GATEWAY_HOSTS,
    GATEWAYS,
    INSTANCE_NODES,
    LEVEL_B,
    LEVEL_C,
    MODEL,
    ROOT,
    SERVING,
    Load,
    atlasctl,
    backend_states,
    cann_versions,
    doctor,
    grep_tree,
    instance_inventory,
    lab,
    lab_api_key,
    lab_hosts,
    layout,
    level_file,
    model_service,
    new_model_version,
    node_path,
    platform_of,
    playbook,
    releases,
    rollout,
    urlopen,
)

CANARY = "atlas-n3"
SCRATCH = "atlas-n4"  # SGLang stand-in: restarts in about a second
PORTS = {"atlas-n1": 8000, "atlas-n2": 8000, "atlas-n3": 30000, "atlas-n4": 30000, "atlas-n5": 30000}
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'
DRILL_BUNDLE = "/var/lib/atlas/drill-bundle"
SHARD = "model-00001-of-00002.safetensors"
OTHER_CANN = "8.3.RC2"


# --- the table's types ---------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    observed: str
    requests_failed: int | str
    data_lost: str
    unmet: list[str]

    @property
    def passed(self) -> bool:
        return not self.unmet


@dataclasses.dataclass(frozen=True)
class Drill:
    id: str
    fault: str
    expected: str
    run: Callable[[], Outcome]


@dataclasses.dataclass
class Row:
    """One printed line of the report."""

    id: str
    fault: str
    expected: str
    observed: str
    requests_failed: int | str
    data_lost: str
    result: str
    unmet: list[str]
    seconds: float


RESULTS: dict[str, Row] = {}
# True while the last check found the fleet converged (the next drill need not check again).
FLEET: dict[str, bool] = {"ready": False}


class Expect:
    """Collects the expectations a drill checks; the unmet ones make the drill fail."""

    def __init__(self) -> None:
        self.unmet: list[str] = []

    def __call__(self, ok: bool, what: str) -> bool:
        if not ok:
            self.unmet.append(what)
        return ok


# --- small helpers ---------------------------------------------------------------------------------

def sh(host: str, command: str, *, check: bool = True, timeout: int = 120) -> str:
    """A shell command on a lab node (one string: `lab ssh` hands it to the remote shell)."""
    return lab("ssh", host, command, check=check, timeout=timeout).stdout


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def failure_message(stdout: str, host: str) -> str:
    """stderr and msg of the first failed task on host in an ansible-playbook output (YAML results)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if not (line.startswith(f"fatal: [{host}]") or line.startswith(f"fatal: [{host} ->")):
            continue
        block = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and not nxt.startswith(" "):
                break
            block.append(nxt)
        try:
            data = yaml.safe_load(textwrap.dedent("\n".join(block))) or {}
        except yaml.YAMLError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        parts = [str(data[k]) for k in ("stderr", "msg") if data.get(k) and data[k] != "non-zero return code"]
        return one_line(" / ".join(parts) or line.split("=>", 1)[-1] + " " + " ".join(block), 600)
    return ""


def load_text(load: Load) -> str:
    total = load.ok + len(load.failed)
    text = f"client load through the gateways: {len(load.failed)} of {total} requests failed"
    if load.failed:
        names = {f"{hv['ansible_host']}:{PORTS[h]}": h for h, hv in lab_hosts().items()}
        names.update({url.removeprefix("https://"): f"gw-{branch}" for branch, url in GATEWAYS.items()})
        kinds: dict[str, int] = {}
        for failure in load.failed:
            kind = failure.replace("http://", "").replace("https://", "")
            for address, name in names.items():
                kind = kind.replace(address, name)
            kinds[one_line(kind, 110)] = kinds.get(one_line(kind, 110), 0) + 1
        text += " (" + "; ".join(f"{n}x {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:3]) + ")"
    return text


def http_status(url: str, key: str | None = None, body: dict | None = None, timeout: float = 30) -> int:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def node_url(host: str, path: str) -> str:
    return f"http://{lab_hosts()[host]['ansible_host']}:{PORTS[host]}{path}"


def non_head_ranks() -> list[str]:
    """The two-node instance's ranks other than its head, once the instance is converged: no gateway backend, and
    their firewall admits only the instance's other ranks to the engine's port (docs/security.md)."""
    return INSTANCE_NODES[1:] if MULTI["inventory"] else []


def node_health(host: str, timeout: float = 10) -> int:
    """The status of ``host``'s engine /health (0: no answer); a non-head rank is asked from the node itself."""
    if host not in non_head_ranks():
        return http_status(node_url(host, "/health"), timeout=timeout)
    url = shlex.quote(node_url(host, "/health"))
    out = sh(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m {int(timeout)} {url}", check=False,
             timeout=int(timeout) + 60)
    return int(out.strip()) if out.strip().isdigit() else 0


def wait_node_healthy(host: str, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node_health(host, timeout=5) == 200:
            return True
        time.sleep(1)
    return False


# The multi-node drills run last, on the lab's two-node instance (labtools.INSTANCE: atlas-n3 + atlas-n4, with
# atlas-n5 as branch west's other backend), converged once by the first of them: from then on atlas-n4 is a
# non-head rank, no backend of its gateway, and the fleet is the instance inventory's.
MULTI: dict[str, Path | None] = {"inventory": None}


def platform_levels() -> dict[str, dict[str, str]]:
    """Each serving node's platform level where the platform drills moved it (LEVEL_B, LEVEL_C, told by the driver
    it runs), as host variables: site.yml then keeps it there (the inventory's own level is older, and a driver
    is never moved back by the driver stage)."""
    levels = {level["driver_version"]: level for level in (LEVEL_B, LEVEL_C)}
    drivers = {host: platform_of(host)["driver"] for host in SERVING}
    return {host: dict(levels[driver]) for host, driver in drivers.items() if driver in levels}


def instance_mode() -> Path:
    """The instance inventory, converged with site.yml the first time (the fleet stays so for later drills), each
    node on the platform level it runs."""
    if MULTI["inventory"] is None:
        inv = instance_inventory(Path(tempfile.mkdtemp(prefix="atlas-drill-instance-")))
        levels = platform_levels()
        if levels:
            (inv / "platform.yml").write_text(yaml.safe_dump({"all": {"hosts": levels}}))
        run = playbook("-i", str(inv), "site.yml")
        if run.returncode != 0:
            raise AssertionError("site.yml with the two-node instance failed:\n" + run.stdout[-4000:])
        MULTI["inventory"] = inv
    return MULTI["inventory"]


def fleet_problems() -> list[str]:
    """What keeps the fleet from being converged and serving (empty: ready for the next drill)."""
    problems = []
    for host in SERVING:
        if node_health(host, timeout=10) != 200:
            problems.append(f"{host} /health not 200")
    problems += [f"{host} is {state} at its gateway" for host, state in backend_states().items()
                 if state != "up" and host not in non_head_ranks()]
    for branch, url in GATEWAYS.items():
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
        if http_status(f"{url}/v1/completions", key=lab_api_key(), body=body, timeout=60) != 200:
            problems.append(f"gateway {branch} does not serve a completion")
    rc, doc, _ = doctor(*(["-i", str(MULTI["inventory"])] if MULTI["inventory"] else []))
    problems += [f"doctor: {host}: {f['check']}: {one_line(f['message'], 120)}" for host, entry in doc["hosts"].items()
                 for f in entry.get("findings", []) if f["severity"] == "error"]
    if rc == 3:
        problems.append("doctor: a host is unreachable")
    return problems


def wait_fleet_ready(timeout: float = 240) -> list[str]:
    deadline = time.monotonic() + timeout
    problems = fleet_problems()
    while problems and time.monotonic() < deadline:
        time.sleep(3)
        problems = fleet_problems()
    return problems


def model_home(host: str) -> str:
    """The model's directory on ``host``, in its inventory's node layout (branch west moves it)."""
    return layout(host)["models_home"]


def current_verifies(host: str) -> bool:
    """The current model version's files match its vendor sums (sha256sum -c)."""
    out = sh(host, f"cd {model_home(host)}/current && sha256sum --quiet -c sha256sums.txt >/dev/null 2>&1; echo rc=$?",
             check=False)
    return "rc=0" in out


def release_snapshots(host: str) -> list[str]:
    return sh(host, f"ls {layout(host)['serving_release_dir']} 2>/dev/null", check=False).split()


def snapshots_kept(expect: Expect, previous: dict[str, str], hosts: Iterable[str]) -> str:
    """The data-lost verdict of a rollout drill: each host still holds the snapshot of the release it ran
    before (what a rollback restores from). A host that lost it is named, and the drill fails."""
    gone = sorted(h for h in hosts if previous[h] not in release_snapshots(h))
    expect(not gone, "the previous release's snapshot is kept on every node")
    return ("none: the previous release's snapshot is kept on every node" if not gone
            else f"the previous release's snapshot is gone on {', '.join(gone)}")


def drill_bundle_removed(host: str) -> None:
    shutil.rmtree(node_path(host, DRILL_BUNDLE), ignore_errors=True)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


class Background:
    """A command run in the background (a rollout, a playbook), its output collected."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def wait(self, timeout: float = 1500) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def running(self) -> bool:
        return self.proc.poll() is None


def rollout_in_background(release: str, *extra: str) -> Background:
    return Background([*ATLASCTL, "rollout", "-i", "inventory/lab", "--json", "--release", release, *extra])


def report_of(stdout: str) -> dict:
    return json.loads(stdout) if stdout.strip().startswith("{") else {}


class Phases:
    """Time marks during a drill: client failures per phase, and the seconds each branch spent with no
    backend enabled at its gateway (sampled from the gateways' backend files)."""

    def __init__(self, load: Load):
        self.load = load
        self.marks: list[tuple[str, float]] = []
        self.empty: dict[str, float] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            states = backend_states()
            now = time.monotonic()
            for branch in GATEWAYS:
                if not any(states[h] == "up" for h in SERVING if BRANCH[h] == branch):
                    self.empty[branch] = self.empty.get(branch, 0.0) + (now - last)
            last = now
            self._stop.wait(0.5)

    def mark(self, label: str) -> None:
        self.marks.append((label, time.monotonic()))

    def failures(self) -> dict[str, int]:
        """Client failures in each phase (the last one ends now)."""
        ends = [t for _, t in self.marks[1:]] + [time.monotonic()]
        return {label: self.load.failed_between(t, end) for (label, t), end in zip(self.marks, ends, strict=True)}

    def text(self) -> str:
        self._stop.set()
        self._sampler.join(5)
        parts = [f"{label} {failed}" for label, failed in self.failures().items()]
        empty = ", ".join(f"{b} {s:.0f} s" for b, s in self.empty.items() if s >= 0.5) or "never"
        return f"failures by phase: {', '.join(parts)}; a branch with no backend enabled at its gateway: {empty}"


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.3) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


# --- 1. corrupted model shard ----------------------------------------------------------------------

def corrupted_shard() -> Outcome:
    expect, node = Expect(), CANARY
    before = model_service(node)
    bundle = new_model_version(node, corrupt=True, on_node=DRILL_BUNDLE)
    try:
        with Load() as load:
            run = playbook("playbooks/models.yml", "playbooks/serving.yml", "--limit", node,
                           "-e", f"atlas_bundle_dir={bundle}")
    finally:
        drill_bundle_removed(node)
    after = model_service(node)
    msg = failure_message(run.stdout, node)
    expect(run.returncode != 0, "the models stage fails")
    expect(SHARD in msg, f"the refusal names {SHARD}")
    expect(after == before, "same engine PID, current link unchanged")
    expect(not load.failed, "0 client requests failed")
    intact = current_verifies(node)
    expect(intact, "the current version still verifies")
    observed = (f"models stage exit {run.returncode} on {node}: {one_line(msg, 260)}; engine {after[0]}, "
                f"PID {before[1]} -> {after[1]}; current {before[2]} -> {after[2]}; {load_text(load)}")
    lost = (f"none: current still {after[2]} and it verifies; the corrupt copy never became current"
            if after[2] == before[2] and intact else f"current {before[2]} -> {after[2]}, verifies={intact}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 2. tampered CANN package ----------------------------------------------------------------------

def tampered_cann() -> Outcome:
    from atlasctl.bundle import write_manifest
    from atlaslab.paths import bundle_dir
    from atlaslab.signing import sign_bundle

    expect, node = Expect(), SCRATCH
    before = cann_versions(node)
    root = node_path(node, DRILL_BUNDLE)
    shutil.rmtree(root, ignore_errors=True)
    (root / "cann").mkdir(parents=True)
    for path in (bundle_dir() / "cann").glob(f"*_{OTHER_CANN}_*"):
        shutil.copy2(path, root / "cann" / path.name)
    write_manifest(root, "drill")
    sign_bundle(root)  # a signed manifest: the tampered file itself is what the role must catch
    toolkit = next(root.glob(f"cann/Ascend-cann-toolkit_{OTHER_CANN}_*"))
    flip_byte(toolkit)
    try:
        with Load() as load:
            run = playbook("playbooks/cann.yml", "--limit", node, "-e", f"atlas_bundle_dir={DRILL_BUNDLE}",
                           "-e", f"cann_version={OTHER_CANN}")
    finally:
        drill_bundle_removed(node)
    after = cann_versions(node)
    trace = sh(node, f"ls -d /usr/local/Ascend/*{OTHER_CANN}* /usr/local/Ascend/*/{OTHER_CANN} 2>/dev/null",
               check=False).split()
    msg = failure_message(run.stdout, node)
    expect(run.returncode != 0, "the cann stage fails")
    expect("before any installer ran" in msg, "refused before any installer ran")
    expect(toolkit.name in msg, f"the refusal names {toolkit.name}")
    expect(after == before, "installed CANN versions unchanged")
    expect(not trace, f"nothing of CANN {OTHER_CANN} on disk")
    expect(not load.failed, "0 client requests failed")
    observed = (f"cann stage (cann_version={OTHER_CANN}, toolkit .run with one flipped byte) exit {run.returncode}: "
                f"{one_line(msg, 260)}; installed toolkit/kernels/nnal {after['toolkit']}/{after['kernels']}/"
                f"{after['nnal']}; {OTHER_CANN} files on the node: {trace or 'none'}; {load_text(load)}")
    lost = (f"none: CANN {before['toolkit']} stays installed, no installer ran" if after == before and not trace
            else f"CANN {before} -> {after}, leftovers {trace}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 3. install killed midway ----------------------------------------------------------------------

def install_killed() -> Outcome:
    expect, node = Expect(), SCRATCH
    before = cann_versions(node)
    sh(node, "mkdir -p /etc/atlas-lab && echo 60 > /etc/atlas-lab/cann-install-delay")
    marker = f"ls -d /usr/local/Ascend/cann-{OTHER_CANN} /usr/local/Ascend/ascend-toolkit/{OTHER_CANN} 2>/dev/null"
    notes = []
    with Load() as load:
        # the drill takes the node down on purpose: its outage is accepted (the gateway sends its branch's
        # requests to the other backends)
        job = Background([str(Path(ENV["PATH"].split(":")[0]) / "ansible-playbook"), "-i", "inventory/lab",
                          "playbooks/cann.yml", "--limit", node, "-e", f"cann_version={OTHER_CANN}",
                          "-e", "atlas_allow_outage=true"])
        started = wait_until(lambda: bool(sh(node, marker, check=False).strip()), 180, poll=1)
        expect(started, f"the {OTHER_CANN} toolkit installer started")
        lab("power", node, "off", timeout=120)
        rc_killed, out_killed, _ = job.wait(600)
        expect(rc_killed != 0, "the interrupted run fails")
        notes.append(f"powered off during the toolkit installer: run exit {rc_killed} "
                     f"({one_line(failure_message(out_killed, node), 120) or 'unreachable'})")
        lab("power", node, "on", timeout=300)
        sh(node, "rm -f /etc/atlas-lab/cann-install-delay")
        mid = cann_versions(node)
        time.sleep(8)  # the engine starts at boot: give it a start or two
        engine = _unit(node)
        notes.append(f"after power-on toolkit/kernels/nnal {mid['toolkit']}/{mid['kernels']}/{mid['nnal']}, engine "
                     f"{engine.get('ActiveState')}/{engine.get('SubState')} (restarts {engine.get('NRestarts')}), "
                     f"/health {http_status(node_url(node, '/health'), timeout=5) or 'no answer'}")
        again = playbook("playbooks/cann.yml", "--limit", node, "-e", f"cann_version={OTHER_CANN}")
        recovered = cann_versions(node)
        expect(again.returncode == 0, "the next run succeeds")
        expect(recovered == dict.fromkeys(recovered, OTHER_CANN), f"the next run installs {OTHER_CANN} completely")
        notes.append(f"next run exit {again.returncode}: {recovered['toolkit']}/{recovered['kernels']}/"
                     f"{recovered['nnal']}")
        back = playbook("playbooks/cann.yml", "--limit", node)
        restored = cann_versions(node)
        expect(back.returncode == 0 and restored == before, "back to the inventory's CANN")
        # the engine crash-looped at boot on the half-installed CANN and ended at its start limit:
        # doctor's fix clears the limit before the restart
        sh(node, "systemctl reset-failed atlas-serving; systemctl restart atlas-serving")
        healthy = wait_node_healthy(node)
        expect(healthy, f"{node} serves again")
    notes.append(f"restored to {restored['toolkit']} (exit {back.returncode}), engine restarted, healthy={healthy}")
    observed = "; ".join(notes) + f"; {load_text(load)}"
    lost = ("none: the half-installed toolkit was replaced by the next run; model and release untouched"
            if recovered == dict.fromkeys(recovered, OTHER_CANN) else f"CANN left at {recovered}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 4. engine crash loop --------------------------------------------------------------------------

def _unit(host: str) -> dict[str, str]:
    out = sh(host, "systemctl show -p ActiveState -p SubState -p NRestarts -p MainPID -p Result atlas-serving")
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


def crash_loop() -> Outcome:
    """SIGKILL the engine each time it comes up until systemd's start limit ends the loop: the unit
    stays failed (doctor, health and the gateway see it); the serving stage brings it back."""
    expect, node = Expect(), SCRATCH
    before = _unit(node)
    killer = ("kills=0; for i in $(seq 1 600); do s=$(systemctl show -p ActiveState --value atlas-serving); "
              "[ \"$s\" = failed ] && break; p=$(systemctl show -p MainPID --value atlas-serving); "
              "if [ \"$p\" != 0 ]; then kill -9 \"$p\" 2>/dev/null && kills=$((kills+1)); fi; sleep 0.2; done; "
              "echo kills=$kills state=$s")
    with Load() as load:
        started = time.monotonic()
        loop_out = sh(node, killer, timeout=180)
        ended_after = time.monotonic() - started
        time.sleep(7)  # longer than RestartSec: nothing restarts it any more
        during = _unit(node)
        rc, doc, out = doctor("-l", node)
        health = playbook("playbooks/health.yml", "--limit", node)
        served = playbook("playbooks/serving.yml", "--limit", node)
        came_back = wait_node_healthy(node, 60)
        after = _unit(node)
    kills = re.search(r"kills=(\d+)", loop_out)
    restarts = int(during.get("NRestarts", 0)) - int(before.get("NRestarts", 0))
    findings = [f for f in doc["hosts"].get(node, {}).get("findings", []) if f["severity"] == "error"]
    service = [f for f in findings if f["check"] == "service"]
    # A SIGKILL loses the response the engine was sending at that instant: nginx cannot retry a
    # response whose first bytes already reached the client. Those are the crash's own cost.
    in_flight = [f for f in load.failed if "IncompleteRead" in f or "Connection reset" in f]
    expect("state=failed" in loop_out, "the loop ends: systemd stops restarting at the start limit")
    expect(during.get("ActiveState") == "failed" and during.get("MainPID") == "0",
           "the unit stays failed (no restart after RestartSec)")
    expect(rc == 1 and any("start limit" in f["message"] for f in service), "atlasctl doctor names the start limit")
    expect(health.returncode != 0, "the health stage fails on the node")
    expect(served.returncode == 0 and came_back and after.get("ActiveState") == "active",
           "the serving stage clears the limit and brings the engine back")
    expect(len(load.failed) == len(in_flight), "the gateway routes around it: only in-flight responses are lost")
    observed = (f"engine SIGKILLed {kills[1] if kills else '?'} times as soon as it came up; systemd restarted it "
                f"{restarts} times, then stopped after {ended_after:.0f} s: {during.get('ActiveState')}/"
                f"{during.get('SubState')} (Result={during.get('Result')}) 7 s later; doctor exit {rc}: "
                f"{one_line('; '.join(f['message'] for f in service) or 'no service finding', 160)}; health stage "
                f"exit {health.returncode}; serving stage exit {served.returncode}, back: {came_back}; "
                f"{load_text(load)}; in flight at a kill: {len(in_flight)}")
    return Outcome(observed, len(load.failed) - len(in_flight),
                   "none: a crash loses the response in flight only; files untouched", expect.unmet)


# --- 5. bad flag release ---------------------------------------------------------------------------

def bad_flag_release() -> Outcome:
    expect = Expect()
    before = releases()
    with Load() as load:
        rc, report = rollout("--release", "drill-bad-flag", "-e", 'serving_flags_extra={"--no-such-flag": true}',
                             "-e", "serving_lint_override=true", "-e", "rollout_health_timeout_s=30",
                             "-e", LENIENT_SLO)
    after = releases()
    failure = report.get("failure") or {}
    args = sh(CANARY, f"cat {layout(CANARY)['serving_args_file']}")
    expect(rc == 1, "the rollout exits 1")
    expect((failure.get("host"), failure.get("wave")) == (CANARY, "canary"), "it fails on the canary")
    expect(after == before, "the fleet stays on the old release")
    expect("--no-such-flag" not in args, "the canary runs the old configuration again")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}: failed on {failure.get('host')} (wave {failure.get('wave')}, gate "
                f"{failure.get('gate')}): {one_line(failure.get('why', ''), 160)}; rolled back to "
                f"{failure.get('previous')}; waves done {report.get('completed')}; releases now "
                f"{sorted(set(after.values()))}; {load_text(load)}")
    lost = ("none: every node on its previous release, its configuration restored from the snapshot"
            if after == before and "--no-such-flag" not in args else f"releases {before} -> {after}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 6. node power-off mid-wave --------------------------------------------------------------------

def power_off_mid_wave() -> Outcome:
    expect, victim, release = Expect(), "atlas-n2", "drill-power-off"
    before = releases()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = rollout_in_background(release, "-e", LENIENT_SLO)
        drained = wait_until(lambda: backend_states()[victim] == "down" or not job.running(), 900)
        expect(drained and job.running(), f"the rollout reached {victim} (drained at its gateway)")
        lab("power", victim, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        phases.mark("node off, then powered on")
        report = report_of(out)
        failure = report.get("failure") or {}
        stopped = releases([h for h in SERVING if h != victim])
        expect(rc == 1, "the rollout stops (exit 1)")
        expect((failure.get("host"), failure.get("wave")) == (victim, "east"), f"it stops at {victim}, wave east")
        expect(report.get("completed") == ["canary"], "only the canary wave completed")
        expect(stopped["atlas-n4"] == before["atlas-n4"], "the later wave (atlas-n4) keeps the old release")
        notes.append(f"{victim} powered off once drained: rollout exit {rc}, failed at {failure.get('host')} "
                     f"(wave {failure.get('wave')}, gate {failure.get('gate')}), waves done {report.get('completed')}, "
                     f"releases {stopped}, gateway states {backend_states()}")
        lab("power", victim, "on", timeout=300)  # back on SSH; resumed at once, as an operator would
        notes.append(f"powered on (/health {http_status(node_url(victim, '/health'), timeout=5) or 'no answer yet'})")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO)
        by_phase = phases.text()
    now = releases()
    expect(rc2 == 0, "--resume completes")
    expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
    notes.append(f"--resume exit {rc2} (resumed from {resumed.get('resumed_from')}, nodes rolled "
                 f"{[n['host'] for n in resumed.get('nodes', [])]}, waves {resumed.get('completed')}): "
                 f"releases {sorted(set(now.values()))}")
    lost = snapshots_kept(expect, before, SERVING)
    expect(not load.failed, "0 client requests failed")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 6b. a node lost before its wave: its branch's last backend is not drained; --resume -------------

def node_lost_before_wave() -> Outcome:
    """atlas-n2 is off when the east wave starts, so atlas-n1 is the branch's last healthy backend: its drain is
    refused (it is not touched and keeps serving) and the rollout stops there, west on the old release. With
    atlas-n2 back, --resume rolls the rest. (Was tests/lab/test_rollout.py's node-lost test: the drills hold
    the long rollouts, and `.ci/run` runs this row after `make test`.)"""
    expect, victim, release = Expect(), "atlas-n2", "drill-node-lost"
    before = releases()
    n1_pid = model_service("atlas-n1")[1]
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark(f"{victim} off, rollout to its stop")
        lab("power", victim, "off", timeout=120)
        try:
            rc, report = rollout("--release", release, "-e", LENIENT_SLO, "-e", "gateway_last_backend_wait_s=5")
        finally:
            phases.mark(f"{victim} powered on")
            lab("power", victim, "on", timeout=300)
        failure = report.get("failure") or {}
        why = str(failure.get("why", ""))
        stopped = releases(["atlas-n1", "atlas-n3", "atlas-n4"])
        expect(rc == 1, "the rollout stops (exit 1)")
        expect((failure.get("host"), failure.get("wave"), failure.get("gate")) == ("atlas-n1", "east", "drain"),
               "it stops at atlas-n1's drain gate, wave east")
        expect("last healthy backend of branch east" in why and victim in why,
               f"the refusal names atlas-n1 the last healthy backend of branch east and {victim}")
        expect(report.get("completed") == ["canary"], "only the canary wave completed")
        expect(model_service("atlas-n1")[1] == n1_pid, "atlas-n1 not restarted (its drain was refused)")
        expect(stopped == {"atlas-n1": before["atlas-n1"], "atlas-n3": release, "atlas-n4": before["atlas-n4"]},
               "the canary on the release, atlas-n1 and the west wave on the old one")
        notes.append(f"{victim} off: rollout exit {rc}, stopped at {failure.get('host')} (wave {failure.get('wave')}, "
                     f"gate {failure.get('gate')}: {one_line(why, 160)}), waves done {report.get('completed')}, "
                     f"releases {stopped}")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO)
        expect(rc2 == 0, "--resume completes")
        expect(resumed.get("completed") == ["canary", "east", "west"], "--resume: canary, east and west done")
        now = releases()
        expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
        notes.append(f"--resume exit {rc2} (waves {resumed.get('completed')}): releases {sorted(set(now.values()))}")
        by_phase = phases.text()
    expect(not load.failed, "0 client requests failed")
    expect(load.ok > 10, "the client load ran (more than 10 requests answered)")
    lost = snapshots_kept(expect, before, SERVING)
    return Outcome("; ".join(notes) + f"; {load_text(load)}; {by_phase}", len(load.failed), lost, expect.unmet)


# --- 7. gateway restart during a rollout -----------------------------------------------------------

def gateway_restart() -> Outcome:
    expect, release = Expect(), "drill-gateway-restart"
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the restart")
        job = rollout_in_background(release, "-e", LENIENT_SLO)
        drained = wait_until(lambda: backend_states()["atlas-n1"] == "down" or not job.running(), 900)
        expect(drained and job.running(), "the rollout reached the east wave")
        phases.mark("restart and 5 s after")
        restarted = lab("ssh", GATEWAY_HOSTS["east"], "systemctl restart nginx", check=False,
                             timeout=120)
        notes.append(f"`systemctl restart nginx` on atlas-gw-east while atlas-n1 was drained: exit "
                     f"{restarted.returncode}")
        time.sleep(5)
        phases.mark("rest of the rollout")
        rc, out, _ = job.wait()
        by_phase = phases.text()
    report = report_of(out)
    now = releases()
    expect(rc == 0, "the rollout completes")
    expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
    failure = report.get("failure") or {}
    notes.append(f"rollout exit {rc}, waves {report.get('completed')}"
                 + (f", failed at {failure.get('host')} gate {failure.get('gate')}: {one_line(failure.get('why'), 120)}"
                    if failure else "")
                 + f"; releases {sorted(set(now.values()))}")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), "none: configuration on disk; a restart loses in-flight requests only",
                   expect.unmet)


# --- 8. disk full while staging a model ------------------------------------------------------------

@contextlib.contextmanager
def small_models_filesystem(host: str, headroom_kib: int) -> Iterator[str]:
    """A tmpfs over the node's model versions directory, holding a copy of what was there, and a
    filler file that leaves headroom_kib free. Yields the filler's path; unmounted at the end."""
    versions = f"{model_home(host)}/versions"
    copy = "/var/lib/atlas/drill-versions-copy"
    filler = f"{versions}/.drill-filler"
    sh(host, f"rm -rf {copy} && cp -a {versions} {copy} && mount -t tmpfs -o size=32m,mode=0755 drill-models "
             f"{versions} && cp -a {copy}/. {versions}/ && rm -rf {copy}")
    try:
        avail = int(sh(host, f"df -B1K --output=avail {versions} | tail -1").strip())
        sh(host, f"fallocate -l {max(avail - headroom_kib, 0)}K {filler}")
        yield filler
    finally:
        sh(host, f"umount {versions} 2>/dev/null || umount -l {versions}", check=False)


def disk_full() -> Outcome:
    expect, node = Expect(), SCRATCH
    before = model_service(node)
    notes = []
    # a new version with new weights in a shard: staging has a whole shard to copy, not only hard links
    bundle = new_model_version(node, corrupt=False, on_node=DRILL_BUNDLE, new_weights=True)
    stages = ("playbooks/preflight.yml", "playbooks/models.yml", "playbooks/serving.yml")
    try:
        with Load() as load:
            with small_models_filesystem(node, headroom_kib=128) as filler:
                df = sh(node, f"df -h --output=size,used,avail,target {model_home(node)}/versions | tail -1")
                run = playbook(*stages, "--limit", node, "-e", f"atlas_bundle_dir={bundle}",
                               "-e", "models_free_headroom_mib=0")
                during = model_service(node)
                msg = failure_message(run.stdout, node)
                preflight_passed = "Preflight | platform | assert free disk space" in run.stdout and \
                    "free disk space" not in msg
                expect(run.returncode != 0, "refused before staging")
                expect("no room to stage model" in msg and "it needs" in msg and " free" in msg,
                       "the error says there is no room: the need and the space free")
                expect(f"{model_home(node)}/versions" in msg, "the error names the path")
                expect(during == before, "same engine PID, current link unchanged")
                intact = current_verifies(node)
                expect(intact, "the current version still verifies")
                notes.append(f"models filesystem {' '.join(df.split())} (size used avail): preflight passed="
                             f"{preflight_passed}; stage exit {run.returncode}: {one_line(msg, 220)}; engine "
                             f"{during[0]} PID {before[1]} -> {during[1]}; current {before[2]} -> {during[2]}")
                sh(node, f"rm -f {filler}")
                again = playbook(*stages, "--limit", node, "-e", f"atlas_bundle_dir={bundle}",
                                 "-e", "models_free_headroom_mib=0")
                moved = model_service(node)
                expect(again.returncode == 0 and moved[2] != before[2], "after freeing space the next run converges")
                notes.append(f"filler removed: next run exit {again.returncode}, current -> {moved[2]}")
                # still on the drill's 32 MiB filesystem: no room for the default 1 GiB headroom
                back = playbook("playbooks/models.yml", "playbooks/serving.yml", "--limit", node,
                                "-e", "models_free_headroom_mib=0")
                expect(back.returncode == 0 and model_service(node)[2] == before[2], "back to the bundle's version")
            # off the drill's filesystem: the bundle's version re-verified where it always was, engine restarted
            reverify = playbook("playbooks/models.yml", "--limit", node)
            sh(node, "systemctl restart atlas-serving")
            healthy = wait_node_healthy(node)
    finally:
        drill_bundle_removed(node)
    final = model_service(node)
    expect(reverify.returncode == 0 and healthy and final[2] == before[2] and current_verifies(node),
           "restored on the original disk")
    notes.append(f"restored: tmpfs unmounted, re-verified (exit {reverify.returncode}), current {final[2]}, "
                 f"healthy={healthy}")
    expect(not load.failed, "0 client requests failed")
    observed = "; ".join(notes) + f"; {load_text(load)}"
    lost = ("none: current never moved while the disk was full and still verifies; the partial copy was only in "
            "the new version's directory" if intact else "the current version no longer verifies")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 9. two concurrent rollouts --------------------------------------------------------------------

def concurrent_rollouts() -> Outcome:
    expect = Expect()
    before = releases()
    with Load() as load:
        # the first one fails its SLO gate on the canary: long enough to collide with, short to wait for
        first = rollout_in_background("drill-concurrent", "-e", 'rollout_slo={"e2el_ms": 1}')
        time.sleep(3)
        second = atlasctl("rollout", "-i", "inventory/lab", "--release", "drill-concurrent-2", check=False,
                          timeout=60)
        rc1, out1, _ = first.wait()
    after = releases()
    report = report_of(out1)
    expect(second.returncode == 2, "the second rollout exits 2")
    expect("already running" in second.stderr, "it says a rollout is already running")
    expect(rc1 == 1 and (report.get("failure") or {}).get("gate") == "slo", "the first one runs its course")
    expect(after == before, "the fleet stays on the old release")
    expect(not load.failed, "0 client requests failed")
    observed = (f"second rollout exit {second.returncode}: {one_line(second.stderr, 200)}; first rollout exit {rc1} "
                f"(failed its SLO gate on {(report.get('failure') or {}).get('host')} and rolled back, as designed "
                f"for this drill); releases {sorted(set(after.values()))}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none: the second rollout touched nothing", expect.unmet)


# --- 9b. a peer's copy corrupted during a fan-out push --------------------------------------------------

FANOUT_DEST = "/var/lib/atlas/drill-fanout"
FANOUT_PEER = "atlas-n3"  # the head of branch west: atlas-n4 and atlas-n5 pull from it in the plan's last round
FANOUT_SHARD = "models/bench-stage/model-00001-of-00002.safetensors"


def _fanout_push(src: Path, *extra: str) -> list[str]:
    return [*ATLASCTL, "bundle", "push", "-i", "inventory/lab", "--src", str(src), "--dest", FANOUT_DEST,
            "--json", *extra]


def _fanout_served(host: str) -> bool:
    """The node's staging server runs (its configuration is written when the fan-out play starts serving)."""
    return "served" in sh(host, "test -e /run/atlas-fanout/rsyncd.conf && echo served", check=False, timeout=30)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def corrupted_fanout_peer() -> Outcome:
    """atlas-n3 holds the bundle already (pushed to it alone first), so the fan-out's check finds it complete and
    it serves from the start; the drill flips a byte of its copy as soon as its server runs, before the plan's last
    round, where atlas-n4 and atlas-n5 pull from it."""
    from atlaslab.benchmarks.stage import make_bundle

    expect = Expect()
    scratch = Path(tempfile.mkdtemp(prefix="drill-fanout-"))
    try:
        src = make_bundle(scratch / "bundle", 128)  # two 64 MiB shards, signed with the lab's key
        good = _digest(src / FANOUT_SHARD)
        seeded = subprocess.run(_fanout_push(src, "--no-fan-out", "--limit", FANOUT_PEER), cwd=ROOT, env=ENV,
                                text=True, capture_output=True, timeout=600)
        expect(seeded.returncode == 0, f"{FANOUT_PEER} holds the bundle before the fan-out")
        with Load() as load:
            run = Background(_fanout_push(src, "--fan-out"))
            served = wait_until(lambda: _fanout_served(FANOUT_PEER) or not run.running(), 600, poll=0.3)
            corrupted = served and run.running()
            if corrupted:
                flip_byte(node_path(FANOUT_PEER, f"{FANOUT_DEST}/{FANOUT_SHARD}"))
            rc, out, err = run.wait(timeout=1500)
        report = report_of(out)
        hosts = {h["host"]: h for h in report.get("hosts", [])}
        refusers = sorted(h for h, r in hosts.items() if FANOUT_SHARD in (r.get("refused") or {}).get(FANOUT_PEER, []))
        digests = {h: _digest(node_path(h, f"{FANOUT_DEST}/{FANOUT_SHARD}")) for h in sorted(hosts)}
        wrong = sorted(h for h, d in digests.items() if d != good)
        expect(corrupted, f"{FANOUT_PEER}'s copy corrupted while the fan-out ran")
        expect(rc == 0 and report.get("verified") is True, "the push ends with every node verified (exit 0)")
        expect(bool(refusers), f"a receiver of {FANOUT_PEER} refused its corrupted copy, naming the shard")
        expect(all(hosts[h].get("via") not in ("", FANOUT_PEER) for h in refusers),
               f"each refuser pulled it from a verified source, not {FANOUT_PEER}")
        expect(not wrong, "every node's copy matches the signed manifest, the corrupted peer's too")
        expect(report.get("controller_ratio", 99) <= 1.2 + 0.2 * len(report.get("fallback") or []),
               "the controller sent the bundle about once")
        expect(not load.failed, "0 client requests failed")
        observed = (f"fan-out exit {rc}, verified={report.get('verified')}, rounds {report.get('rounds')}, "
                    f"controller x{report.get('controller_ratio')}; byte flipped in {FANOUT_PEER}'s {FANOUT_SHARD} "
                    f"while it served: {corrupted}; refused by {', '.join(refusers) or 'nobody'}; sources "
                    + ", ".join(f"{h} <- {r.get('via')}" for h, r in sorted(hosts.items()))
                    + f"; copies that differ from the manifest at the end: {', '.join(wrong) or 'none'}; "
                    f"{load_text(load)}" + (f"; stderr {one_line(err, 200)}" if rc else ""))
        lost = ("none: every node's copy verifies against the signed manifest, the corrupted one was refused and "
                "repaired" if not wrong and rc == 0 else f"copies not verified: {', '.join(wrong) or '?'}")
        return Outcome(observed, len(load.failed), lost, expect.unmet)
    finally:
        for host in lab_hosts():
            shutil.rmtree(node_path(host, FANOUT_DEST), ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


# --- 10. missing and expired API key; 11. a key rotated by a rollout ------------------------------------

class KeyedInventory:
    """A copy of the lab inventory whose branch west has serving_api_key in its group_vars (0600): where
    an operator keeps a (vaulted) key. Everything else is the lab inventory's."""

    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="drill-key-"))
        self.path = self.scratch / "inventory"
        (self.path / "group_vars").mkdir(parents=True)
        shutil.copy2(ROOT / "inventory/lab/hosts.yml", self.path / "hosts.yml")
        for path in (ROOT / "inventory/lab/group_vars").glob("*.yml"):
            shutil.copy2(path, self.path / "group_vars" / path.name)
        # the lab inventory's own data beside it (serving_profile_dirs, atlas_compat_extra_tables: relative to it)
        shutil.copytree(ROOT / "inventory/lab/profiles", self.path / "profiles")
        shutil.copy2(ROOT / "inventory/lab/compat.yml", self.path / "compat.yml")
        self.west_vars = self.path / "group_vars" / "branch_west.yml"
        self.plain_west = self.west_vars.read_text()

    def set_key(self, key: str) -> None:
        self.west_vars.write_text(self.plain_west + f"serving_api_key: {key}\n")
        self.west_vars.chmod(0o600)

    def playbook(self, *args: str) -> subprocess.CompletedProcess:
        """A stage on this inventory; the restarts of a key change are accepted (atlas_allow_outage), as the lab
        tools' runs accept them: the drill runs no client load, and the staged way is drill key-rollout's."""
        cmd = [str(Path(ATLASCTL[0]).parent / "ansible-playbook"), "-i", str(self.path), *args,
               "-e", "atlas_allow_outage=true"]
        return subprocess.run(cmd, cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=900)

    def leaks(self, keys: tuple[str, ...], outputs: list[str]) -> list[str]:
        """Where the keys were written, other than this inventory's group_vars file."""
        found = [f"command output {i}" for i, text in enumerate(outputs) for key in keys if key in text]
        for key in keys:
            found += [hit for hit in grep_tree(self.scratch, key.encode()) if hit != str(self.west_vars)]
            found += grep_tree(ROOT / "artifacts", key.encode())
        return sorted(set(found))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _short(paths: list[str], limit: int = 4) -> str:
    shown = [p.replace(str(ROOT) + "/", "") for p in paths[:limit]]
    return ", ".join(shown) + (f" (+{len(paths) - limit} more)" if len(paths) > limit else "")


def _lab_keys(branch: str) -> int:
    """The branch's engines and its gateway back on the lab inventory's key (the serving and gateway stages)."""
    serving = playbook("playbooks/serving.yml", "--limit", f"branch_{branch}")
    gateway = playbook("playbooks/gateway.yml", "--limit", f"branch_{branch}:{GATEWAY_HOSTS[branch]}")
    for host in (h for h in SERVING if BRANCH[h] == branch):
        wait_node_healthy(host, 90)
    return serving.returncode or gateway.returncode


def api_keys() -> Outcome:
    expect = Expect()
    west = [h for h in SERVING if BRANCH[h] == "west"]
    old, new = "atlas-drill-old-" + secrets.token_hex(12), "atlas-drill-new-" + secrets.token_hex(12)
    inv = KeyedInventory()
    log = inv.scratch / "ansible.log"
    outputs: list[str] = []
    gw = GATEWAYS["west"]
    completion = {"model": MODEL, "prompt": "Balance?", "max_tokens": 2}
    ENV["ANSIBLE_LOG_PATH"] = str(log)
    try:
        for key in (old, new):  # set a key, then rotate it: the old one is the expired key
            inv.set_key(key)
            for stage, limit in (("serving", "branch_west"), ("gateway", "branch_west:atlas-gw-west")):
                run = inv.playbook(f"playbooks/{stage}.yml", "--limit", limit, "-v")
                outputs.append(run.stdout + run.stderr)
                expect(run.returncode == 0, f"the {stage} stage sets / rotates the key")
            for host in west:
                wait_node_healthy(host, 90)
        codes = {
            "no key": http_status(f"{gw}/v1/completions", body=completion),
            "old (rotated) key": http_status(f"{gw}/v1/completions", key=old, body=completion),
            "current key": http_status(f"{gw}/v1/completions", key=new, body=completion),
            "/health (not an API path)": http_status(f"{gw}/health", key=new),
        }
        health = atlasctl("health", "-i", str(inv.path), "-l", "branch_west", check=False, timeout=300)
        outputs.append(health.stdout + health.stderr)
        rc, doc, out = doctor_on(inv.path, ",".join(west))
        outputs.append(out)
        key_findings = [f for h in west for f in doc["hosts"][h]["findings"] if f["check"] == "api-key"]
    finally:
        ENV.pop("ANSIBLE_LOG_PATH", None)
        restored = _lab_keys("west")
    leaks = inv.leaks((old, new), outputs)
    expect(codes["no key"] == 401, "no key: 401")
    expect(codes["old (rotated) key"] == 401, "the rotated-away key: 401")
    expect(codes["current key"] == 200, "the current key: 200")
    expect(codes["/health (not an API path)"] == 404, "/health is no path the gateway forwards: 404")
    expect(health.returncode == 0, "atlasctl health passes on the keyed branch")
    expect(not key_findings, "doctor: no api-key finding (a key is configured and enforced)")
    expect(log.is_file() and log.stat().st_size > 0, "the ansible log was written (the grep proves something)")
    expect(not leaks, "the keys appear in no output, log or artifact")
    expect(restored == 0, "the lab's key back")
    observed = ("west branch keyed (serving_api_key in the inventory's group_vars, 0600), then rotated with the "
                "serving and gateway stages; through the west gateway: "
                + ", ".join(f"{k} -> {v}" for k, v in codes.items())
                + f"; atlasctl health exit {health.returncode}"
                + (f" ({one_line(health.stdout[-400:] + health.stderr[-300:], 500)})" if health.returncode else "")
                + f"; doctor exit {rc}, api-key findings "
                f"{len(key_findings)}; keys found in: {_short(leaks) or 'nothing'} (searched: playbook output with "
                "-v, ansible log, health and doctor output, artifacts/)")
    lost = "none" if not leaks else f"no data lost, but the API keys leaked to {len(leaks)} file(s)/output(s)"
    inv.close()
    return Outcome(observed, "n/a", lost, expect.unmet)


def doctor_on(inventory: Path, limit: str) -> tuple[int, dict, str]:
    proc = atlasctl("doctor", "-i", str(inventory), "--json", "-l", limit, check=False, timeout=180)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {"hosts": {}}), \
        proc.stdout + proc.stderr


def _keys_file(scratch: Path, name: str, data: dict) -> Path:
    path = scratch / name
    path.write_text(json.dumps(data) + "\n")
    path.chmod(0o600)
    return path


def key_rollout() -> Outcome:
    """A key rotated with an overlap through staged rollouts under client load, on the vLLM branch (east): the
    branch first accepts [new, previous] (its gateway with the branch's first node, each engine as it rolls)
    while its clients switch to the new key, and the previous key is retired in a second rollout. Branch west
    (SGLang takes one key) keeps the lab's key and serves throughout."""
    expect = Expect()
    lab_key = lab_api_key()
    first = "atlas-drill-key1-" + secrets.token_hex(12)
    inv = KeyedInventory()
    runs, outputs = [], []

    def roll(release: str, keys: dict) -> tuple[int, dict]:
        vars_file = _keys_file(inv.scratch, f"{release}.yml", keys)
        proc = atlasctl("rollout", "-i", "inventory/lab", "--json", "--release", release, "--vars", str(vars_file),
                        "-l", "branch_east", "-e", LENIENT_SLO, check=False, timeout=1200)
        outputs.append(proc.stdout + proc.stderr)
        report = report_of(proc.stdout)
        runs.append(f"{release} -l branch_east: exit {proc.returncode}"
                    + (f" (failed at {report['failure'].get('host')}, gate {report['failure'].get('gate')})"
                       if report.get("failure") else ""))
        return proc.returncode, report

    east = [h for h in SERVING if BRANCH[h] == "east"]
    with Load() as load:  # every client starts on the lab's key
        rc1, _ = roll("drill-key-rotate", {"serving_api_keys": [first, lab_key]})
        both = {h: (key_status(h, lab_key), key_status(h, first)) for h in east}
        load.keys = {"east": first, "west": lab_key}  # east's clients switch
        time.sleep(3)
        rc2, _ = roll("drill-key-retire", {"serving_api_keys": [first]})
        retired = {h: (key_status(h, lab_key), key_status(h, first)) for h in east}
        west = {h: key_status(h, lab_key) for h in SERVING if BRANCH[h] == "west"}
    leaks = [hit for hit in inv.leaks((first,), outputs) if not hit.startswith(str(inv.scratch))]
    expect((rc1, rc2) == (0, 0), "the two rollouts complete")
    expect(all(v == (200, 200) for v in both.values()), "during the overlap east accepts both keys")
    expect(all(v == (401, 200) for v in retired.values()), "after the retirement east refuses the previous key")
    expect(all(v == 200 for v in west.values()), "west serves with its one key")
    expect(not leaks, "the keys appear in no output or artifact")
    expect(not load.failed, "0 client requests failed")
    _lab_keys("east")
    inv.close()
    observed = (f"{'; '.join(runs)}; east (previous, new) during the overlap {both}, after {retired}; west {west}; "
                f"keys found in: {_short(leaks) or 'nothing'}; {load_text(load)}")
    lost = "none" + (f"; the API keys leaked to {len(leaks)} file(s)" if leaks else "")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


def key_status(host: str, key: str) -> int | None:
    """GET /v1/models straight at the node with ``key``."""
    request = urllib.request.Request(node_url(host, "/v1/models"), headers={"Authorization": f"Bearer {key}"})
    try:
        with urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


# --- multi-node instance: a rank frozen, an NPU link down, a rank node powered off mid-rollout -------

HEAD, RANK1 = INSTANCE_NODES
WEST_WAVE = 'rollout_waves=[{"name": "west", "hosts": "branch_west"}]'


def _unit_state() -> dict[str, tuple[str, str]]:
    """(release, engine main PID) of each rank."""
    out = {}
    for host in INSTANCE_NODES:
        record = json.loads(sh(host, f"cat {layout(host)['serving_record']}"))
        out[host] = (record["release_id"], model_service(host)[1])
    return out


def instance_out_and_back() -> Outcome:
    """Out: a new release over branch west, the instance first as one unit (both ranks in one batch, stopped
    together, NPUs free, head first), then atlas-n5. Back: the next release fails the entry's SLO gate, so both
    ranks go back to the release they ran and restart together; atlas-n5 is not touched. (A drill rather than a
    lab test: a multi-node scenario of minutes; the instance's convergence is a lab test.)"""
    expect, inv = Expect(), instance_mode()
    other = "atlas-n5"
    unit = [HEAD, RANK1]
    before = {h: model_service(h)[1] for h in (*unit, other)}
    previous = releases([*unit, other])
    notes = []
    with Load() as load:
        rc, report = rollout("--release", "drill-unit-out", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
        plan = (report.get("plan") or [{}])[0]
        out = {h: model_service(h)[1] for h in (*unit, other)}
        starts = {h: sh(h, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value atlas-serving"
                        ).strip().lstrip("@") for h in unit}
        expect(rc == 0 and report.get("completed") == ["west"], "the rollout completes")
        expect(plan.get("units") == [unit, [other]] and plan.get("batches") == [2, 1],
               "the plan: the instance as one unit (a batch of its 2 ranks), then atlas-n5")
        expect(releases([*unit, other]) == dict.fromkeys([*unit, other], "drill-unit-out"), "west on the release")
        expect(all(out[h] != before[h] for h in (*unit, other)), "every node restarted")
        expect(starts[HEAD].isdigit() and starts[RANK1].isdigit() and int(starts[HEAD]) <= int(starts[RANK1]),
               "the head started first")
        notes.append(f"out: exit {rc}, plan units {plan.get('units')} batches {plan.get('batches')}, starts {starts}")
        rc, report = rollout("--release", "drill-unit-back", "-e", 'rollout_slo={"e2el_ms": 1}', "-e", WEST_WAVE,
                             inventory=inv)
        failure = report.get("failure") or {}
        followed = [f for f in report.get("rollbacks") or [] if f.get("host") == RANK1]
        back = {h: model_service(h)[1] for h in (*unit, other)}
        expect(rc == 1 and (failure.get("host"), failure.get("gate"), failure.get("via_unit")) == (HEAD, "slo", False),
               "the second rollout stops at the entry's SLO gate")
        expect(bool(followed) and followed[0].get("via_unit") and HEAD in followed[0].get("why", ""),
               "rank 1 is rolled back with its unit, naming the entry")
        expect(releases([*unit, other]) == dict.fromkeys([*unit, other], "drill-unit-out"), "back as one unit")
        expect(all(back[h] != out[h] for h in unit), "both ranks restarted on the release they ran")
        expect(back[other] == out[other], "the rollout stopped before atlas-n5")
        notes.append(f"back: exit {rc}, failure {failure.get('host')} gate {failure.get('gate')}, rank 1 rolled back "
                     f"via its unit: {bool(followed)}")
    expect(not load.failed, "0 client requests failed")
    lost = snapshots_kept(expect, previous, unit)
    return Outcome("; ".join(notes) + f"; {load_text(load)}", len(load.failed), lost, expect.unmet)


def rank_frozen() -> Outcome:
    """Every process of rank 1 SIGSTOPped: the head waits on a collective forever, its /health may still
    answer for a while (SGLang's 20 s health timeout; vLLM's stays 200). The hang check finds it, the
    recover playbook drains the entry, restarts both ranks together and enables the entry again."""
    expect, inv = Expect(), instance_mode()
    before = _unit_state()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("freeze to the health check")
        sh(RANK1, "systemctl kill -s SIGSTOP atlas-serving")
        health = atlasctl("health", "-i", str(inv), check=False, timeout=300)
        expect(health.returncode == 1 and "hung" in health.stdout + health.stderr,
               "atlasctl health reports the instance hung")
        said = next((ln for ln in (health.stdout + health.stderr).splitlines() if "hung" in ln), "")
        notes.append(f"rank 1 ({RANK1}) SIGSTOPped; atlasctl health exit {health.returncode}: {one_line(said, 200)}")
        phases.mark("recover.yml")
        drained = {}
        watcher = threading.Thread(target=lambda: drained.update(
            seen=wait_until(lambda: backend_states()[HEAD] == "down", 300)), daemon=True)
        watcher.start()
        recover = playbook("-i", str(inv), "playbooks/recover.yml")
        watcher.join(5)
        by_phase = phases.text()
    after = _unit_state()
    expect(recover.returncode == 0, "playbooks/recover.yml succeeds")
    expect("hung" in recover.stdout, "recover.yml names the hang it found")
    expect(bool(drained.get("seen")), f"the entry {HEAD} was drained at its gateway")
    expect(backend_states()[HEAD] == "up", "the entry is enabled again")
    expect(all(after[h][1] != before[h][1] for h in INSTANCE_NODES), "both ranks restarted (new engine PIDs)")
    expect(all(after[h][0] == before[h][0] for h in INSTANCE_NODES), "the release is unchanged")
    expect(all(current_verifies(h) for h in INSTANCE_NODES), "the model verifies on both ranks")
    expect(not load.failed, "0 client requests failed (the one in flight on the frozen instance is retried)")
    notes.append(f"recover.yml exit {recover.returncode}, entry drained {bool(drained.get('seen'))}, "
                 f"PIDs {before[HEAD][1]}/{before[RANK1][1]} -> {after[HEAD][1]}/{after[RANK1][1]}, "
                 f"release {after[HEAD][0]}")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    lost = ("none: release, configuration and model unchanged on both ranks"
            if all(after[h][0] == before[h][0] for h in INSTANCE_NODES) else f"releases {before} -> {after}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


def npu_link_down() -> Outcome:
    """NPU 2 of rank 1 loses its link (the hccn_tool double's fault): a rollout of the instance stops at
    its network gate, before anything is drained or restarted, naming the node, the NPU and the link."""
    expect, inv = Expect(), instance_mode()
    before = _unit_state()
    lab("npu", RANK1, "--device", "2", "--link", "down", timeout=60)
    try:
        with Load() as load:
            rc, report = rollout("--release", "drill-link-down", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
    finally:
        lab("npu", RANK1, "--device", "2", "--link", "up", timeout=60)
    failure = report.get("failure") or {}
    after = _unit_state()
    expect(rc == 1, "the rollout stops (exit 1)")
    expect(failure.get("gate") == "network", f"it stops at the network gate (got {failure.get('gate')})")
    named = [r.get("why", "") for r in report.get("rollbacks") or []]
    expect(any(RANK1 in w and "NPU 2" in w and "link" in w.lower() for w in named),
           "the failure names the node, NPU 2 and its link")
    expect(after == before, "neither rank was touched (same release, same engine PIDs)")
    observed = (f"NPU 2 of {RANK1} link down; rollout exit {rc}, stopped at gate {failure.get('gate')}: "
                + " | ".join(one_line(w, 200) for w in named) + f"; ranks {after}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none: nothing was touched", expect.unmet)


def rank_power_off() -> Outcome:
    """Rank 1's node powered off while the instance rolls: the unit rolls back (the head is stopped: an
    instance cannot run without a rank; the entry stays drained, atlas-n5 serves the branch); with the node
    back, --resume rolls the whole instance and the rest of the wave."""
    expect, inv, release = Expect(), instance_mode(), "drill-rank-off"
    before = releases()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = Background([*ATLASCTL, "rollout", "-i", str(inv), "--json", "--release", release, "-e", LENIENT_SLO,
                          "-e", WEST_WAVE])
        drained = wait_until(lambda: backend_states()[HEAD] == "down" or not job.running(), 900)
        expect(drained and job.running(), f"the rollout reached the instance (its entry {HEAD} drained)")
        lab("power", RANK1, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        report = report_of(out)
        failure = report.get("failure") or {}
        head_state = model_service(HEAD)[0]
        expect(rc == 1, "the rollout stops (exit 1)")
        expect(RANK1 in str(failure.get("why", "")) + str(failure.get("host", "")) + str(failure.get("lost", "")),
               f"the failure names the lost rank {RANK1}")
        expect(head_state != "active", f"the head {HEAD} is stopped (it cannot run without its rank)")
        expect(backend_states()[HEAD] == "down", "the entry stays drained")
        notes.append(f"{RANK1} powered off after the entry was drained: rollout exit {rc}, failure at "
                     f"{failure.get('host')} gate {failure.get('gate')} (lost {failure.get('lost')}): "
                     f"{one_line(failure.get('why'), 160)}; head {head_state}; gateway states {backend_states()}")
        phases.mark("node off, then powered on")
        lab("power", RANK1, "on", timeout=300)
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
        per_phase = phases.failures()
        by_phase = phases.text()
    now = releases()
    west = [h for h in SERVING if BRANCH[h] == "west"]
    expect(rc2 == 0, "--resume completes")
    expect(all(now[h] == release for h in west), "branch west (the instance and atlas-n5) on the new release")
    # A completion in flight on the instance when its rank loses power cannot finish (half of its model ran
    # there): the drain had marked the entry down and was waiting for it. One client per gateway, so at most one
    # such request; none may fail in any other phase.
    # A completion in flight on the instance when its rank loses power has sent nothing yet: the gateway gives the
    # silent backend up after gateway_read_timeout_s and sends it to atlas-n5 (proxy_next_upstream timeout
    # non_idempotent), before the client's own timeout.
    expect(sum(per_phase.values()) == 0, "0 client requests failed, the one in flight at the power-off included")
    notes.append(f"--resume exit {rc2}, nodes rolled {[n['host'] for n in resumed.get('nodes', [])]}: west on "
                 f"{sorted({now[h] for h in west})}")
    lost = snapshots_kept(expect, before, west)
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- platform upgrades: driver, firmware and CANN under client load (docs/platform-upgrades.md) -------

LEVELS: dict[str, Path] = {}


def level(name: str) -> Path:
    """The release variables of a platform level (labtools.LEVEL_B, LEVEL_C), written once."""
    if name not in LEVELS:
        LEVELS[name] = level_file(Path(tempfile.mkdtemp(prefix="atlas-drill-level-")), f"level-{name}",
                                  {"b": LEVEL_B, "c": LEVEL_C}[name])
    return LEVELS[name]


def _pack_gates(report: dict) -> dict[str, dict[str, str]]:
    """{host: {gate: result}} from the rollout's evidence pack."""
    pack = Path(str((report.get("evidence") or {}).get("dir") or "")) / "evidence.json"
    try:
        nodes = json.loads(pack.read_text()).get("nodes", [])
    except (OSError, ValueError):
        return {}
    return {n["host"]: {g["gate"]: g["result"] for g in n.get("gates", [])} for n in nodes}


def site_yml_live() -> Outcome:
    """site.yml with platform level B (another driver, firmware and CANN) on the live lab, as a site would run it
    (no atlas_allow_outage): refused at preflight, naming every serving node and the rollout command."""
    expect = Expect()
    before = {h: platform_of(h) for h in SERVING}
    releases_before = releases()
    with Load() as load:
        run = playbook("site.yml", "-e", f"@{level('b')}", allow_outage=False)
    out = " ".join(run.stdout.split())
    after = {h: platform_of(h) for h in SERVING}
    named = [h for h in SERVING if f"{h} would" in out]
    expect(run.returncode != 0 and "Refused: this run would take serving nodes down." in out,
           "site.yml is refused at preflight")
    expect(named == SERVING, "the refusal names every serving node")
    expect("atlasctl rollout -i" in out, "the refusal names the rollout command")
    # preflight reads the driver's state (the driver role's state tasks); no stage's own play starts
    expect("PLAY [Driver |" not in run.stdout and "PLAY [CANN |" not in run.stdout, "no stage after preflight ran")
    expect(after == before and releases() == releases_before, "nothing changed on any node")
    expect(not load.failed, "0 client requests failed")
    said = re.search(r"Refused: [^.]*\.[^.]*\.", out)
    observed = (f"site.yml exit {run.returncode}: {one_line(said.group(0) if said else out[-300:], 300)}; nodes named "
                f"{named}; platform and releases {'unchanged' if after == before else 'CHANGED'}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none" if after == before else f"{before} -> {after}", expect.unmet)


def platform_canary_fails() -> Outcome:
    """Level B's SLO gate fails on the canary after its platform moved: the canary goes back to its release on that
    release's CANN (8.5.0, kept beside 9.1.0), the driver stays new (inside 8.5.0's window, as the plan said), the
    rollout stops, nothing else changed."""
    expect, release = Expect(), "drill-platform-b-fails"
    before = {h: platform_of(h) for h in SERVING}
    releases_before = releases()
    with Load() as load:
        rc, report = rollout("--release", release, "--vars", str(level('b')), "-e", 'rollout_slo={"e2el_ms": 1}')
    after = {h: platform_of(h) for h in SERVING}
    now = releases()
    failure = report.get("failure") or {}
    canary = after[CANARY]
    expect(rc == 1 and (failure.get("host"), failure.get("gate")) == (CANARY, "slo"),
           f"the rollout stops at the canary {CANARY}'s SLO gate")
    expect((canary["driver"], canary["firmware"]) == ("25.5.1", "7.8.1.0.100"), "the canary keeps the new driver")
    expect(now[CANARY] == releases_before[CANARY], "the canary back on its previous release")
    expect(canary["pins"].get(now[CANARY]) == "8.5.0" and {"8.5.0", "9.1.0"} <= set(canary["cann_installed"]),
           "its release pinned to CANN 8.5.0, 9.1.0 installed beside it")
    expect(wait_node_healthy(CANARY, 60), "the canary serves")
    others = [h for h in SERVING if h != CANARY]
    expect(all(after[h] == before[h] and now[h] == releases_before[h] for h in others), "no other node changed")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}, failed at {failure.get('host')} gate {failure.get('gate')}; canary driver "
                f"{canary['driver']}/{canary['firmware']}, release {now[CANARY]} pinned to "
                f"{canary['pins'].get(now[CANARY])}, CANN installed {canary['cann_installed']}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none" if now[CANARY] == releases_before[CANARY] else
                   f"canary on {now[CANARY]}", expect.unmet)


def platform_upgrade() -> Outcome:
    """The whole lab from level A to level B through `atlasctl rollout` under load: each unit drained, its engine
    stopped, firmware then driver, the reboot, CANN 9.1.0 beside 8.5.0, the release, the gates, enabled (the canary,
    at level B since platform-canary-fails, skips the platform steps)."""
    expect, release = Expect(), "drill-platform-b"
    releases_before = releases()
    plan = atlasctl("rollout", "-i", "inventory/lab", "--release", release, "--vars", str(level("b")), "--plan",
                    "--json", check=False)
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to level B")
        rc, report = rollout("--release", release, "--vars", str(level("b")), "-e", LENIENT_SLO)
        by_phase = phases.text()
    after = {h: platform_of(h) for h in SERVING}
    gates = _pack_gates(report)
    expect(plan.returncode == 0 and json.loads(plan.stdout or "{}").get("point_of_no_return", {}).get("units") == [],
           "the plan has no point of no return")
    expect(rc == 0, "the rollout completes")
    expect(all((after[h]["driver"], after[h]["firmware"]) == ("25.5.1", "7.8.1.0.100") for h in SERVING),
           "every node runs driver 25.5.1 / firmware 7.8.1.0.100")
    expect(all(after[h]["pins"].get(release) == "9.1.0" for h in SERVING), "every node's release pins CANN 9.1.0")
    expect(all(after[h]["pins"].get(releases_before[h]) == "8.5.0" and "8.5.0" in after[h]["cann_installed"]
               for h in SERVING), "the previous CANN 8.5.0 still installed and pinned by the previous release")
    expect(all(gates.get(h, {}).get("driver") == "passed" for h in SERVING if h != CANARY),
           "the evidence pack records the driver gate of every moved node")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}, waves {report.get('completed')}; drivers "
                f"{sorted({after[h]['driver'] for h in SERVING})}; CANN installed "
                f"{sorted({v for h in SERVING for v in after[h]['cann_installed']})}; {load_text(load)}; {by_phase}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)


def platform_power_off() -> Outcome:
    """Level C (driver 25.5.2) over branch east; atlas-n2 powered off once its engine stopped for the driver (during
    the install or the reboot): the rollout stops with it drained and named; after power-on --resume completes."""
    expect, victim, release = Expect(), "atlas-n2", "drill-platform-power-off"
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = rollout_in_background(release, "--vars", str(level("c")), "-e", LENIENT_SLO, "-l", "branch_east")
        stopped = wait_until(lambda: not job.running() or (
            backend_states()[victim] == "down"
            and sh(victim, "systemctl is-active atlas-serving", check=False).strip() != "active"), 900)
        expect(stopped and job.running(), f"the rollout stopped {victim}'s engine for its driver")
        lab("power", victim, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        report = report_of(out)
        failure = report.get("failure") or {}
        expect(rc == 1 and failure.get("host") == victim, f"the rollout stops naming {victim}")
        expect(backend_states()[victim] == "down", f"{victim} stays drained")
        notes.append(f"{victim} powered off with its engine stopped: rollout exit {rc}, failed at "
                     f"{failure.get('host')} gate {failure.get('gate')}; gateway states {backend_states()}")
        phases.mark("node off, then powered on")
        lab("power", victim, "on", timeout=300)
        expect(sh(victim, "systemctl is-active atlas-serving", check=False).strip() != "active",
               "after power-on the old release does not start (the unit stays off until the rollout)")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO, "-l", "branch_east")
        by_phase = phases.text()
    east = [h for h in SERVING if BRANCH[h] == "east"]
    after = {h: platform_of(h) for h in east}
    expect(rc2 == 0, "--resume completes")
    expect(all(after[h]["driver"] == "25.5.2" and releases([h])[h] == release for h in east),
           "branch east on driver 25.5.2 and the release")
    expect(not load.failed, "0 client requests failed")
    notes.append(f"--resume exit {rc2}, nodes rolled {[n['host'] for n in resumed.get('nodes', [])]}; east drivers "
                 f"{ {h: after[h]['driver'] for h in east} }")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), "none", expect.unmet)


def platform_downgrade() -> Outcome:
    """Branch east from level C (driver 25.5.2) back to level B (25.5.1) through `atlasctl rollout`, under load:
    without --allow-downgrade the plan refuses it before any unit is touched; with it each unit is drained, its
    engine stopped, the installers' --upgrade takes firmware then driver back (Huawei's installers go back with
    --upgrade), the reboot, the release, the gates, enabled."""
    expect, release = Expect(), "drill-platform-downgrade"
    east = [h for h in SERVING if BRANCH[h] == "east"]
    before = {h: platform_of(h) for h in east}
    releases_before = releases()
    args = ("--release", release, "--vars", str(level("b")), "-e", LENIENT_SLO, "-l", "branch_east")
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout without --allow-downgrade")
        rc1, refused = rollout(*args)
        between = {h: platform_of(h) for h in east}
        releases_between = releases()
        phases.mark("rollout with --allow-downgrade")
        rc2, report = rollout(*args, "--allow-downgrade")
        by_phase = phases.text()
    after = {h: platform_of(h) for h in east}
    said = json.dumps(refused.get("failure") or {}) if "raw" not in refused else str(refused["raw"].stdout)
    expect(all(before[h]["driver"] == "25.5.2" for h in east), "branch east starts on driver 25.5.2 (level C)")
    expect(rc1 != 0 and "downgrade" in said, "without --allow-downgrade the rollout is refused, naming the downgrade")
    expect(between == before and releases_between == releases_before, "the refusal touched no node")
    expect(rc2 == 0, "with --allow-downgrade the rollout completes")
    expect(all((after[h]["driver"], after[h]["firmware"]) == ("25.5.1", "7.8.1.0.100") for h in east),
           "branch east runs driver 25.5.1 / firmware 7.8.1.0.100 again")
    expect(all(releases([h])[h] == release for h in east), "branch east on the release")
    expect(not load.failed, "0 client requests failed")
    observed = (f"without --allow-downgrade: exit {rc1}, {one_line(said, 200)}; with it: exit {rc2}; east drivers "
                f"{ {h: before[h]['driver'] for h in east} } -> { {h: after[h]['driver'] for h in east} }, firmware "
                f"{sorted({after[h]['firmware'] for h in east})}; {load_text(load)}; {by_phase}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)


def platform_unit() -> Outcome:
    """The two-node instance moves together: level C over branch west, both ranks stopped, driver, reboot, the NPU
    network verified again, the release, as one unit; then atlas-n5."""
    expect, inv, release = Expect(), instance_mode(), "drill-platform-unit"
    with Load() as load:
        rc, report = rollout("--release", release, "--vars", str(level("c")), "-e", LENIENT_SLO, "-e", WEST_WAVE,
                             inventory=inv)
    west = [*INSTANCE_NODES, "atlas-n5"]
    after = {h: platform_of(h) for h in west}
    gates = _pack_gates(report)
    expect(rc == 0, "the rollout completes")
    expect(all(after[h]["driver"] == "25.5.2" for h in west), "every west node on driver 25.5.2")
    moved = ("stop", "driver", "network-after")
    expect(all(gates.get(h, {}).get(g) == "passed" for h in INSTANCE_NODES for g in moved),
           "both ranks passed stop, driver and the NPU network again together")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}; drivers { {h: after[h]['driver'] for h in west} }; ranks' gates "
                f"{ {h: gates.get(h) for h in INSTANCE_NODES} }; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)


# --- the table ---------------------------------------------------------------------------------------

DRILLS = [
    Drill("corrupt-shard", "new model version with one flipped byte in a shard (atlas-n3)",
          "refused naming the shard; engine keeps serving (same PID); current link unchanged; 0 failed",
          corrupted_shard),
    Drill("tampered-cann", f"bundle copy with one flipped byte in the CANN {OTHER_CANN} toolkit .run (atlas-n4)",
          "refused before any installer runs, naming the package; installed CANN unchanged; 0 failed",
          tampered_cann),
    Drill("disk-full", "models filesystem of atlas-n4 full (128 KiB free) while staging a new model version",
          "refused before staging, naming the path, the need and the space free; current unchanged, engine keeps "
          "serving; after freeing space the "
          "next run converges; 0 failed", disk_full),
    Drill("crash-loop", "atlas-n4's engine SIGKILLed each time it comes up, until systemd gives up",
          "systemd restarts it up to its start limit, then the unit stays failed; doctor names the start limit; "
          "the health stage fails; the serving stage brings it back; gateway routes around it: 0 failed "
          "(responses in flight at a kill are the crash's own)",
          crash_loop),
    Drill("api-key", "API key set on the west branch, then rotated: requests with no key and with the old key",
          "through the gateway, no key and old key: 401; current key: 200; /health not forwarded: 404; atlasctl "
          "health and doctor pass; the keys in no output, log or artifact",
          api_keys),
    Drill("key-rollout", "the API key rotated on branch east with an overlap, by staged rollouts "
          "(`atlasctl rollout --vars keys.yml`, 0600) while clients switch keys",
          "two rollouts complete; east accepts both keys during the overlap, only the new one after; the keys in "
          "no output or artifact; 0 failed", key_rollout),
    Drill("install-killed", f"atlas-n4 powered off during the CANN {OTHER_CANN} toolkit installer",
          "the run fails; the next run installs completely; back to 8.5.0; engine healthy", install_killed),
    Drill("concurrent-rollouts", "a second `atlasctl rollout` while one runs",
          "second refused (exit 2, 'already running'); the first runs its course; fleet unchanged; 0 failed",
          concurrent_rollouts),
    Drill("corrupt-fanout-peer", f"a byte of {FANOUT_PEER}'s copy flipped while a `bundle push --fan-out` runs "
          "(its receivers pull from it in the last round)",
          "the receivers refuse the corrupted copy naming the shard and pull it from a verified source; the corrupted "
          "peer is repaired; every node verified, the controller sends the bundle about once; 0 failed",
          corrupted_fanout_peer),
    Drill("bad-flag-release", "rollout of a release with an unknown engine flag, lint overridden",
          "canary fails to start and is rolled back; rollout stops; fleet on the old release; 0 failed",
          bad_flag_release),
    Drill("power-off-mid-wave", "atlas-n2 powered off after its wave drained it",
          "rollout stops at atlas-n2 (wave east); atlas-n4 keeps the old release; after power-on --resume "
          "completes; 0 failed", power_off_mid_wave),
    Drill("node-lost", "atlas-n2 powered off before the east wave starts, under load",
          "atlas-n1 (the branch's last healthy backend) not drained nor restarted; rollout stops there, west on the "
          "old release; after power-on --resume completes; 0 failed",
          node_lost_before_wave),
    Drill("gateway-restart", "`systemctl restart nginx` on atlas-gw-east during a rollout, under load",
          "rollout completes, fleet on the new release; client failures: what the restart costs",
          gateway_restart),
    # the platform moves (docs/platform-upgrades.md): refused by site.yml, then through the rollout, level A -> B -> C
    Drill("site-yml-live", "site.yml with platform level B (driver 25.5.1, firmware, CANN 9.1.0) on the live lab",
          "refused at preflight naming every serving node and the rollout command; nothing changed on any node; "
          "0 failed", site_yml_live),
    Drill("platform-canary-fails", "rollout of level B whose SLO gate fails on the canary after its platform moved",
          "the canary back on its release on CANN 8.5.0 (kept beside 9.1.0), the driver stays 25.5.1 as planned; the "
          "rollout stops; nothing else changed; 0 failed", platform_canary_fails),
    Drill("platform-upgrade", "the whole lab from level A to level B through `atlasctl rollout`, under load",
          "every node on driver 25.5.1 and CANN 9.1.0; the previous CANN 8.5.0 still installed and pinned by the "
          "previous release; 0 failed", platform_upgrade),
    Drill("platform-power-off", "level C over branch east; atlas-n2 powered off during its driver install/reboot",
          "the rollout stops with atlas-n2 drained and named; the old release does not start at power-on; --resume "
          "completes; 0 failed", platform_power_off),
    Drill("platform-downgrade", "branch east from level C back to level B (driver 25.5.2 -> 25.5.1) through "
          "`atlasctl rollout`, first without, then with --allow-downgrade",
          "refused before any node is touched without the flag; with it firmware then driver go back by the "
          "installers' --upgrade, the reboot, the release; 0 failed", platform_downgrade),
    # the multi-node drills, last: the first converges the lab's two-node instance (atlas-n3 + atlas-n4)
    Drill("instance-out-and-back", "two-node instance: a release rolled over branch west, then one that fails the "
          "entry's SLO gate, under load",
          "out as one unit (both ranks one batch, head first), then atlas-n5; back as one unit (rank 1 follows its "
          "entry), atlas-n5 untouched; 0 failed", instance_out_and_back),
    Drill("rank-frozen", "two-node instance: every process of rank 1 (atlas-n4) SIGSTOPped, under load",
          "atlasctl health reports it hung; recover.yml drains the entry, restarts both ranks together, enables "
          "it; release and model unchanged (0 data lost); 0 failed (the request in flight is retried elsewhere)",
          rank_frozen),
    Drill("npu-link-down", "two-node instance: NPU 2 of atlas-n4 link down, then a rollout of the instance",
          "the rollout stops at its network gate naming atlas-n4, NPU 2 and the link; neither rank touched",
          npu_link_down),
    Drill("rank-power-off", "two-node instance: atlas-n4 powered off while the instance rolls",
          "the unit rolls back (head stopped, entry drained, atlas-n5 serves); after power-on --resume completes; "
          "0 failed (the request in flight on the instance is retried on atlas-n5 by the gateway)", rank_power_off),
    Drill("platform-unit", "two-node instance: level C rolled over branch west (both ranks' driver and firmware)",
          "both ranks move together (stop, driver, reboot, NPU network verified again), then atlas-n5; 0 failed",
          platform_unit),
]
