"""The roles' own asserts on whole names (the serving role's release id, the cann role's version), run by Ansible on
localhost: a trailing newline is refused as the CLI refuses it (tests/unit/atlasctl/test_whole_names.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.role


def _role_task(path: str, name: str) -> dict:
    return next(t for t in yaml.safe_load((REPO / path).read_text()) if t["name"] == name)


def test_the_roles_asserts_refuse_a_trailing_newline(tmp_path):
    """The serving role's release id and the cann role's version asserts, as the roles write them, run by Ansible
    on localhost for each value: the good one passes, the one with a newline fails."""
    release = _role_task("roles/serving/tasks/state.yml", "Serving | state | the release id is a directory name")
    version = _role_task("roles/cann/tasks/facts.yml", "CANN | facts | the version is one Huawei publishes")
    pattern = yaml.safe_load((REPO / "roles/cann/vars/main.yml").read_text())["__cann_version_pattern"]
    cases = {"release-good": (release, {"__serving_release": "bank-2026.12.0"}),
             "release-newline": (release, {"__serving_release": "bank-2026.12.0\n"}),
             "cann-good": (version, {"cann_version": "8.5.0"}),
             "cann-newline": (version, {"cann_version": "8.5.0\n"})}
    tasks = []
    for case, (task, values) in cases.items():
        values = {**values, "__cann_version_pattern": pattern}
        tasks.append({**task, "vars": values, "ignore_errors": True, "register": f"case_{case.replace('-', '_')}"})
    results = {c: f"{{{{ case_{c.replace('-', '_')}.failed | default(false) }}}}" for c in cases}
    tasks.append({"ansible.builtin.copy": {"dest": str(tmp_path / "out.json"), "mode": "0600",
                                           "content": json.dumps(results)}})
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local", "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    failed = {case: value.strip() == "True" for case, value in json.loads((tmp_path / "out.json").read_text()).items()}
    assert failed == {"release-good": False, "release-newline": True, "cann-good": False, "cann-newline": True}
