"""The evidence pack written by the playbooks themselves (ansible-playbook, no atlasctl): after a failed batch, and
by playbooks/rollout.yml alone where atlasctl would write it, signed and free of secrets."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

from atlasctl import evidence, rollout
from support.ansible_run import ansible_env, run_playbook
from support.evidence import API_KEY, ENV_KEY, PLAN, evidence_keys, secrets_in

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.role,
              pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    """The controller's evidence key (its public keyring) and a stranger's (support.evidence)."""
    with evidence_keys(tmp_path_factory.mktemp("evidence-keys")) as made:
        yield made


def _playbook(tmp: Path, play: str, inventory: dict, *extra: str) -> subprocess.CompletedProcess:
    (tmp / "play.yml").write_text(play)
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return run_playbook(tmp / "hosts.yml", tmp / "play.yml", *extra, cwd=tmp,
                        env=ansible_env(tmp, ATLAS_ROLLOUT_DIR=str(tmp / "rollouts")))


# The shape of a wave (playbooks/rollout/wave.yml, tasks/node.yml): a node's gates in a block, the rollback in
# its rescue ending in a failure, the evidence write in its always; the read-back is the real one.
WAVE = f"""
- name: Rollout | plan
  hosts: localhost
  gather_facts: false
  tasks:
    - name: the plan
      ansible.builtin.set_fact:
        rollout_plan: {json.dumps(PLAN)}
        rollout_started_at: "2026-03-01T10:00:00Z"
        rollout_evidence_path: "{{{{ pack }}}}"
- name: Rollout | wave 1
  hosts: n1:n2
  gather_facts: false
  serial: 2
  tasks:
    - name: gates
      block:
        - name: the release's files on the node
          ansible.builtin.copy:
            dest: "{{{{ serving_release_dir }}}}/r2/{{{{ item.name }}}}"
            content: "{{{{ item.content }}}}"
            mode: "0600"
          loop:
            - {{name: atlas-serving.env, content: "VLLM_API_KEY={{{{ serving_env_extra.VLLM_API_KEY }}}}\\n"}}
            - {{name: atlas-serving.args, content: "--model\\n/m\\n"}}
            - {{name: atlas-serving.json, content: '{{"release_id": "r2"}}'}}
            - {{name: atlas-serving.keys.yaml, content: '{{"api-key": "{{{{ serving_api_key }}}}"}}'}}
          no_log: true
        - name: the SLO gate fails on n2
          ansible.builtin.fail:
            msg: "e2el 900 ms > 300 ms"
          when: inventory_hostname == 'n2'
        - name: Rollout | node | read back what the node runs (evidence)
          ansible.builtin.import_tasks: {REPO}/playbooks/rollout/tasks/readback.yml
        - name: report
          ansible.builtin.set_fact:
            rollout_node_report: {{host: "{{{{ inventory_hostname }}}}", wave: canary, previous: r1, release: r2,
                                  result: ok, unit: ["{{{{ inventory_hostname }}}}"]}}
      rescue:
        - name: what failed
          ansible.builtin.set_fact:
            rollout_failure: {{host: n2, wave: east, gate: slo, previous: r1, release: r2,
                              why: "{{{{ ansible_failed_result.msg }}}} {{{{ serving_api_key }}}}"}}
        - name: stop
          ansible.builtin.fail:
            msg: ROLLOUT FAILED
      always:
        - name: Rollout | node | evidence pack after this batch
          ansible.builtin.import_tasks: {REPO}/playbooks/rollout/tasks/evidence.yml
"""


def test_the_playbook_writes_the_pack_after_a_failed_batch(tmp_path: Path, keys) -> None:
    controller, _, keyring = keys
    node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "serving_release_dir": str(tmp_path / "NODE" / "releases"),
            "serving_args_file": "/etc/atlas/serving/atlas-serving.args",
            "serving_env_file": "/etc/atlas/serving/atlas-serving.env",
            "serving_record": "/etc/atlas/serving/atlas-serving.json"}
    (tmp_path / "NODE" / "releases" / "r2").mkdir(parents=True)
    inventory = {"all": {"vars": {"atlas_evidence_signing_key": controller.fingerprint,
                                  "atlas_evidence_gnupg_home": str(controller.path), "serving_api_key": API_KEY,
                                  "serving_env_extra": {"VLLM_API_KEY": ENV_KEY}, "atlas_release_id": "r2",
                                  "pack": str(tmp_path / "r2.evidence")},
                         "hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}},
                         "children": {"atlas_nodes": {"hosts": {"n1": node, "n2": node}}}}}
    proc = _playbook(tmp_path, WAVE, inventory)
    assert proc.returncode != 0 and "ROLLOUT FAILED" in proc.stdout, proc.stdout[-3000:]
    pack = tmp_path / "r2.evidence"
    assert evidence.verify(pack, keyring=keyring, fingerprint=controller.fingerprint).ok
    record = evidence.read(pack)
    assert [n["result"] for n in record["nodes"]] == ["ok", "failed", "not reached"]
    assert record["complete"] and record["status"] == "failed"
    env = (tmp_path / "NODE" / "releases" / "r2" / "atlas-serving.env").read_bytes()
    assert record["nodes"][0]["files_sha256"] == {
        "atlas-serving.env": hashlib.sha256(env).hexdigest(),
        "atlas-serving.args": hashlib.sha256(b"--model\n/m\n").hexdigest(),
        "atlas-serving.json": hashlib.sha256(b'{"release_id": "r2"}').hexdigest()}  # the key file is not read
    assert "e2el 900 ms > 300 ms" in record["nodes"][1]["rollback"]["why"]
    assert secrets_in(pack) == [] and API_KEY not in proc.stdout + proc.stderr


def test_rollout_yml_alone_leaves_a_signed_pack_where_atlasctl_would(tmp_path: Path, keys) -> None:
    """playbooks/rollout.yml run with ansible-playbook: the plan play and the last play write the pack under
    <rollouts>/<inventory>-<hash>/<start>-<release>.evidence; with no key named it is unsigned, loudly."""
    controller, _, keyring = keys
    inventory = {"all": {"vars": {"atlas_evidence_signing_key": controller.fingerprint,
                                  "atlas_evidence_gnupg_home": str(controller.path), "rollout_waves": []},
                         "hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
    play = f"- name: The rollout\n  ansible.builtin.import_playbook: {REPO}/playbooks/rollout.yml\n"
    proc = _playbook(tmp_path, play, inventory, "-e", "atlas_release_id=r9")
    assert proc.returncode == 0, proc.stdout[-3000:]
    folder = tmp_path / "rollouts" / rollout.inventory_key(tmp_path / "hosts.yml")
    packs = list(folder.glob("*-r9.evidence"))
    assert len(packs) == 1, list(folder.parent.rglob("*"))
    record = evidence.read(packs[0])
    assert record["complete"] and record["status"] == "ok" and record["release"] == "r9"
    assert packs[0].name == mu.run_stem(record["started_at"], "r9") + ".evidence"
    assert evidence.verify(packs[0], keyring=keyring, fingerprint=controller.fingerprint).ok

    del inventory["all"]["vars"]["atlas_evidence_signing_key"]
    proc = _playbook(tmp_path, play, inventory, "-e", "atlas_release_id=r10")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "UNSIGNED EVIDENCE PACK" in proc.stdout
    (unsigned,) = folder.glob("*-r10.evidence")
    assert not (unsigned / "SHA256SUMS.asc").exists() and "UNSIGNED" in evidence.read(unsigned)["signature"]["note"]
