"""What the fault drills share: the table's row types (Drill, Outcome, Row, Expect), the run's state (RESULTS,
FLEET, MULTI), the lab's constants, and the helpers that more than one family of drills uses (a shell on a node,
the client load's verdict, node and fleet health, background rollouts, phase timing, platform levels).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from labtools import (
    ATLASCTL,
    BRANCH,
    ENV,
    GATEWAYS,
    INSTANCE_NODES,
    LEVEL_B,
    LEVEL_C,
    MODEL,
    ROOT,
    SERVING,
    Load,
    backend_states,
    doctor,
    lab,
    lab_api_key,
    lab_hosts,
    layout,
    level_file,
    urlopen,
)

CANARY = "atlas-n3"
SCRATCH = "atlas-n4"  # SGLang stand-in: restarts in about a second
PORTS = {"atlas-n1": 8000, "atlas-n2": 8000, "atlas-n3": 30000, "atlas-n4": 30000, "atlas-n5": 30000}
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'


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


# --- the engine's unit (crash-loop, install-killed) -----------------------------------------------

def _unit(host: str) -> dict[str, str]:
    out = sh(host, "systemctl show -p ActiveState -p SubState -p NRestarts -p MainPID -p Result atlas-serving")
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


# --- platform levels and the rollout's evidence pack (the platform drills, platform-unit) -----------

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
