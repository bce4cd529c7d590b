"""Fault drills on the API keys: a missing and an expired key at the gateway, a key rotated with an overlap by
staged rollouts under client load; neither may leave a key in any output, log or artifact.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from drill_common import (
    LENIENT_SLO,
    Expect,
    Outcome,
    http_status,
    load_text,
    node_url,
    one_line,
    report_of,
    wait_node_healthy,
)
from labtools import (
    ATLASCTL,
    BRANCH,
    ENV,
    GATEWAY_HOSTS,
    GATEWAYS,
    MODEL,
    ROOT,
    SERVING,
    Load,
    atlasctl,
    grep_tree,
    lab_api_key,
    playbook,
    urlopen,
)

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
