"""Run the suite's playbooks through ansible-runner: one private data dir per run,
events folded into per-host results, secrets kept out of what we keep."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from atlasctl.errors import UsageError
from atlasctl.paths import state_dir, suite_root


@dataclasses.dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: bool = False
    unreachable: bool = False
    failed_task: str = ""
    message: str = ""
    facts: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RunResult:
    status: str
    rc: int
    hosts: dict[str, HostResult]
    artifacts: Path
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not any(h.failed or h.unreachable for h in self.hosts.values())


def resolve_inventory(path: str | Path) -> Path:
    inv = Path(path)
    if not inv.is_absolute():
        inv = (Path.cwd() / inv) if (Path.cwd() / inv).exists() else suite_root() / inv
    if not inv.exists():
        raise UsageError(f"inventory {path} does not exist",
                         fix="pass -i inventory/<site> (for the lab: `atlas-lab up` writes inventory/lab/hosts.yml)")
    return inv.resolve()


def _fold(event: dict, hosts: dict[str, HostResult]) -> None:
    data = event.get("event_data") or {}
    host = data.get("host")
    if not host:
        return
    result = hosts.setdefault(host, HostResult(host))
    res = data.get("res") or {}
    kind = event.get("event")
    if kind == "runner_on_ok":
        result.ok += 1
        result.changed += int(bool(res.get("changed")))
        result.facts.update(res.get("ansible_facts") or {})
    elif kind == "runner_on_failed" and not data.get("ignore_errors"):
        result.failed = True
        result.failed_task = data.get("task", "")
        result.message = str(res.get("msg") or res.get("stderr") or "")[:2000]
    elif kind == "runner_on_unreachable":
        result.unreachable = True
        result.failed_task = data.get("task", "")
        result.message = str(res.get("msg", ""))[:2000]


def run_playbook(
    playbook: str,
    inventory: str | Path,
    *,
    extravars: dict | None = None,
    limit: str | None = None,
    on_event: Callable[[dict], None] | None = None,
    quiet: bool = True,
    vars_files: Sequence[Path] = (),
) -> RunResult:
    """Run playbooks/<playbook> (path relative to the repository root) and fold its events.

    ``extravars`` are written into ansible-runner's command line (and so into its artifacts);
    ``vars_files`` go as ``-e @<path>``: only the path is recorded, so secrets belong there."""
    root = suite_root()
    inv = resolve_inventory(inventory)
    play = root / playbook
    if not play.exists():
        raise UsageError(f"playbook {playbook} not found under {root}")
    import ansible_runner

    private = state_dir() / "runs"
    private.mkdir(parents=True, exist_ok=True)
    # ansible-runner re-applies private_data_dir/env/extravars (and env/cmdline...) to every later
    # run: a variable of one run (a key, an SLO) must never leak into the next. Nothing is kept there.
    shutil.rmtree(private / "env", ignore_errors=True)
    hosts: dict[str, HostResult] = {}

    def handler(event: dict) -> bool:
        # A rescued failure is reconciled from the stats at the end.
        _fold(event, hosts)
        if on_event:
            on_event(event)
        return True

    started = time.monotonic()
    runner = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(root),
        playbook=str(play),
        inventory=str(inv),
        extravars=extravars or {},
        cmdline=" ".join(f"-e {shlex.quote('@' + str(Path(f).resolve()))}" for f in vars_files) or None,
        limit=limit,
        quiet=quiet,
        event_handler=handler,
        rotate_artifacts=20,
        suppress_env_files=True,
        # ansible-runner turns host key checking off unless told otherwise; ansible.cfg keeps it on.
        # ansible-playbook is looked up on PATH: this interpreter's venv first (atlasctl run without activating it).
        envvars={"ANSIBLE_CONFIG": str(root / "ansible.cfg"),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
                 "ANSIBLE_HOST_KEY_CHECKING": "True"},
    )
    stats = runner.stats or {}
    for host in (stats.get("rescued") or {}):
        if host in hosts:
            hosts[host].failed = False
    return RunResult(runner.status, runner.rc, hosts, Path(runner.config.artifact_dir),
                     time.monotonic() - started)
