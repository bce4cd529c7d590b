"""A rollout's evidence pack (docs/evidence.md): built from a rollout's record it verifies, with real gpg and
throwaway keys; one byte changed, a file removed, a file added, SHA256SUMS rewritten to match, a signature by
another key or none at all is refused, one line naming the file and what is wrong; bad input is exit 2; no
secret is ever in a pack. The playbook side writes the pack without atlasctl: after a batch that failed, and
at the end of playbooks/rollout.yml, where atlasctl would put it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

from atlasctl import cli, evidence, exitcodes, rollout
from atlasctl.runner import RunResult

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")

API_KEY = "sk-atlas-evidence-0f3c9d7e2b"  # serving_api_key, in the hostvars and in a failure's message
ENV_KEY = "vllm-env-key-71d0c2aa95"  # VLLM_API_KEY, in serving_env_extra and in the rendered env file
VAULT_KEY = "vault-key-5e8812bb40"  # what an inventory's vault_serving_api_key holds
SECRETS = (API_KEY, ENV_KEY, VAULT_KEY)
PLAN = [{"name": "canary", "hosts": ["n1"], "index": 1, "skipped": False, "batches": [1]},
        {"name": "east", "hosts": ["n2", "n3"], "index": 2, "skipped": False, "batches": [1]}]


class Home:
    """A throwaway gpg home with one no-passphrase signing key."""

    def __init__(self, path: Path, uid: str):
        self.path = path
        path.mkdir(mode=0o700, parents=True)
        self._gpg("--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self._gpg("--with-colons", "--list-keys").stdout.decode()
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def _gpg(self, *args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(["gpg", "--homedir", str(self.path), "--batch", "--no-tty", "--passphrase", "", *args],
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc

    def export(self, dest: Path) -> Path:
        dest.write_bytes(self._gpg("--export", self.fingerprint).stdout)
        return dest

    def sign(self, data: Path, dest: Path) -> None:
        self._gpg("--yes", "--local-user", self.fingerprint, "--armor", "--detach-sign", "--output", str(dest),
                  str(data))

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.path), "--kill", "gpg-agent"], check=False,
                       capture_output=True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    """The controller's evidence key (its public keyring) and a stranger's (another throwaway key)."""
    tmp = tmp_path_factory.mktemp("evidence-keys")
    controller, stranger = Home(tmp / "controller", "evidence@controller"), Home(tmp / "stranger", "x@elsewhere")
    keyring = controller.export(tmp / "controller.gpg")
    yield controller, stranger, keyring
    controller.close()
    stranger.close()


def hostvars(env_sha256: str = "ab" * 32) -> dict:
    """What the rollout leaves in the hostvars: n1 passed every gate, n2 failed its SLO gate and went back,
    n3 was not reached; secrets where an inventory and a run put them."""
    shared = {"serving_api_key": API_KEY, "serving_env_extra": {"VLLM_API_KEY": ENV_KEY, "OMP_NUM_THREADS": "8"},
              "vault_serving_api_key": VAULT_KEY, "health_api_key": API_KEY,
              "atlas_bundle_manifest_sha256": "cd" * 32, "atlas_bundle_signer": "EF" * 20}
    record = {"release_id": "r2", "engine": "vllm", "engine_release": "vllm-ascend-0.9.1", "model_version": "9f" * 8,
              "runtime": "venv", "port": 8000}
    return {
        "n1": {**shared, "rollout_converged": False, "rollout_unit": ["n1"],
               "rollout_node_report": {"host": "n1", "wave": "canary", "previous": "r1", "release": "r2",
                                       "result": "ok", "unit": ["n1"], "at": "2026-03-01T10:02:00Z",
                                       "slo": {"completed": 8, "failed": 0, "violations": [],
                                               "metrics": {"e2el_ms": {"p95": 210.0}},
                                               "thresholds": {"e2el_ms": 60000}}},
               "rollout_health_probe": {"health": 200, "waited_s": 2.5, "completion_tokens": 8, "record": record,
                                        "progress": {"verdict": "ok", "reason": "the completion finished"},
                                        "invocation": {"module_args": {"api_key": API_KEY}}},
               "health_probe": {"health": 200, "record": record},
               "ansible_facts": {"cann": {"driver": {"installed": True, "version": "24.1.rc1"},
                                          "firmware": {"installed": True, "version": "7.5.0.1.129"},
                                          "toolkit": {"installed": True, "version": "8.3.RC1"}}},
               "rollout_readback": {"files": [
                   {"path": "/etc/atlas/serving/releases/r2/atlas-serving.env", "checksum": env_sha256},
                   {"path": "/etc/atlas/serving/releases/r2/atlas-serving.args", "checksum": "12" * 32}]}},
        "n2": {**shared, "rollout_converged": False, "rollout_unit": ["n2"],
               "rollout_failure": {"host": "n2", "wave": "east", "gate": "slo", "task": "Rollout | slo | assert",
                                   "why": f"n2: SLO gate: e2el p95 900 ms > 300 ms (sent with {API_KEY})",
                                   "previous": "r1", "release": "r2", "converged": False, "via_unit": False,
                                   "lost": [], "unit": ["n2"], "measured": {"metrics": {"e2el_ms": {"p95": 900.0}}}},
               "health_probe": {"health": 200, "record": {**record, "release_id": "r1"}}},
        "n3": dict(shared),
    }


def build(folder: Path, keys=None, hv: dict | None = None, **inputs) -> Path:
    controller = keys[0] if keys else None
    record = mu.build_record({"release": "r2", "inventory": "/site/inventory/bank", "plan": PLAN,
                              "started_at": "2026-03-01T10:00:00Z",
                              "nodes": mu.nodes(hv or hostvars(), PLAN, []), **inputs},
                             signing_key=controller.fingerprint if controller else "",
                             gnupg_home=str(controller.path) if controller else "")
    written = mu.write_pack(str(folder), record, signing_key=controller.fingerprint if controller else "",
                            gnupg_home=str(controller.path) if controller else "")
    assert written["error"] == "", written
    return folder


def verify_cli(pack: Path, keys, *extra: str) -> list[str]:
    controller, _, keyring = keys
    return ["evidence", "verify", str(pack), "--keyring", str(keyring), "--fingerprint", controller.fingerprint,
            *extra]


def grep(folder: Path, needles=SECRETS) -> list[str]:
    return [f"{path.name}: {needle}" for path in folder.rglob("*") if path.is_file()
            for needle in needles if needle.encode() in path.read_bytes()]


def test_a_pack_from_a_rollout_record_verifies_and_shows(tmp_path: Path, keys, capsys) -> None:
    pack = build(tmp_path / "r2.evidence", keys)
    assert sorted(p.name for p in pack.iterdir()) == ["SHA256SUMS", "SHA256SUMS.asc", "evidence.json"]
    assert cli.main(verify_cli(pack, keys)) == exitcodes.OK
    assert f"signed by {keys[0].fingerprint}" in capsys.readouterr().out
    record = json.loads((pack / "evidence.json").read_text())
    assert record["status"] == "failed" and record["complete"]  # a failed node ends the rollout: the last record
    assert record["bundle"] == {"manifest_sha256": "cd" * 32, "signed_by": "EF" * 20}
    assert record["controller"]["user"] and record["controller"]["hostname"]
    n1, n2, n3 = record["nodes"]
    assert (n1["result"], n2["result"], n3["result"]) == ("ok", "failed", "not reached")
    assert n1["versions"]["driver"] == "24.1.rc1" and n1["versions"]["cann"] == "8.3.RC1"
    assert n1["versions"]["model_version"] == "9f" * 8 and n1["versions"]["engine_release"] == "vllm-ascend-0.9.1"
    assert n1["files_sha256"] == {"atlas-serving.env": "ab" * 32, "atlas-serving.args": "12" * 32}
    gates = {g["gate"]: g for g in n1["gates"]}
    assert gates["health"]["figures"]["health"] == 200 and gates["slo"]["figures"]["metrics"]["e2el_ms"]["p95"] == 210
    assert [g["result"] for g in n2["gates"]][-2:] == ["failed", "not run"]
    assert record["rollbacks"][0]["host"] == "n2" and record["rollbacks"][0]["running_after"] == "r1"

    assert cli.main(["evidence", "show", str(pack), "--html", str(tmp_path / "page.html")]) == exitcodes.OK
    table = capsys.readouterr().out
    assert "rollout r2: FAILED" in table and "vllm-ascend-0.9.1" in table and "24.1.rc1" in table
    assert "n2 (wave east): gate slo" in table
    page = (tmp_path / "page.html").read_text()
    assert "<script" not in page and "<link" not in page and "vllm-ascend-0.9.1" in page and "e2el" in page
    assert cli.main(["evidence", "show", str(pack), "--json"]) == exitcodes.OK
    assert json.loads(capsys.readouterr().out) == record


def _one_byte(pack: Path) -> None:
    data = bytearray((pack / "evidence.json").read_bytes())
    data[data.index(b'"release": "r2"') + len(b'"release": "r')] ^= 0x01  # the release "r2" -> "r3"
    (pack / "evidence.json").write_bytes(bytes(data))


def _rehash(pack: Path) -> None:
    _one_byte(pack)
    digest = hashlib.sha256((pack / "evidence.json").read_bytes()).hexdigest()
    (pack / "SHA256SUMS").write_text(f"{digest}  evidence.json\n")


TAMPERING = {
    "one byte changed": (_one_byte, "evidence.json: changed: sha256"),
    "a file removed": (lambda p: (p / "evidence.json").unlink(), "evidence.json: missing"),
    "a file added": (lambda p: (p / "notes.txt").write_text("hello\n"), "notes.txt: extra: not listed"),
    "SHA256SUMS rewritten to match": (_rehash, "SHA256SUMS.asc: BAD signature"),
    "the signature removed": (lambda p: (p / "SHA256SUMS.asc").unlink(), "SHA256SUMS.asc: missing: the pack is NOT"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_pack_is_refused_naming_the_file(tmp_path: Path, keys, capsys, case: str) -> None:
    pack = build(tmp_path / "r2.evidence", keys)
    tamper, reason = TAMPERING[case]
    tamper(pack)
    assert cli.main(verify_cli(pack, keys)) == exitcodes.FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{pack}/") and reason in lines[0], lines


def test_a_foreign_signature_is_refused(tmp_path: Path, keys, capsys) -> None:
    """Signed again by another key: in the keyring or not, it is not the pinned one."""
    controller, stranger, keyring = keys
    pack = build(tmp_path / "r2.evidence", keys)
    stranger.sign(pack / "SHA256SUMS", pack / "SHA256SUMS.asc")
    assert cli.main(verify_cli(pack, keys)) == exitcodes.FAILED
    assert "SHA256SUMS.asc: a foreign signature" in capsys.readouterr().err
    both = stranger.export(tmp_path / "both.gpg")
    both.write_bytes(keyring.read_bytes() + both.read_bytes())
    argv = ["evidence", "verify", str(pack), "--keyring", str(both), "--fingerprint", controller.fingerprint]
    assert cli.main(argv) == exitcodes.FAILED
    err = capsys.readouterr().err
    assert f"a foreign signature: good, but by key {stranger.fingerprint}, not the pinned" in err, err


def test_an_unsigned_pack_says_so_and_is_refused_unless_allowed(tmp_path: Path, keys, capsys) -> None:
    pack = build(tmp_path / "r2.evidence")
    record = json.loads((pack / "evidence.json").read_text())
    assert record["signature"]["signed"] is False and "UNSIGNED" in record["signature"]["note"]
    assert cli.main(["evidence", "verify", str(pack)]) == exitcodes.FAILED
    assert "SHA256SUMS.asc: missing: the pack is NOT signed" in capsys.readouterr().err
    assert cli.main(["evidence", "verify", str(pack), "--allow-unsigned"]) == exitcodes.OK
    assert "UNSIGNED" in capsys.readouterr().out
    assert cli.main(["evidence", "show", str(pack)]) == exitcodes.OK
    assert "!!! UNSIGNED" in capsys.readouterr().out


def test_bad_input_is_exit_2_with_one_line(tmp_path: Path, keys, capsys) -> None:
    controller, _, keyring = keys
    pack = build(tmp_path / "r2.evidence", keys)
    (tmp_path / "empty").mkdir()
    cases = [
        ["evidence", "verify", str(tmp_path / "nowhere")],
        ["evidence", "verify", str(tmp_path / "empty"), "--allow-unsigned"],
        ["evidence", "verify", str(pack)],  # signed, and no key named to check it against
        ["evidence", "verify", str(pack), "--keyring", str(keyring), "--fingerprint", controller.fingerprint[-16:]],
        ["evidence", "verify", str(pack), "--keyring", str(tmp_path / "none.gpg"), "--fingerprint",
         controller.fingerprint],
        ["evidence", "show", str(tmp_path / "empty")],
    ]
    for argv in cases:
        assert cli.main(argv) == exitcodes.USAGE, argv
        err = capsys.readouterr().err
        assert err.startswith("atlasctl: error: ") and "Traceback" not in err, err


def test_no_secret_is_ever_in_a_pack(tmp_path: Path, keys) -> None:
    """Keys in the hostvars, in the environment and in a failure's message: none is in the pack, which records
    only the sha256 of the env file that carries one."""
    env = tmp_path / "atlas-serving.env"
    env.write_text(f"VLLM_API_KEY={ENV_KEY}\nOMP_NUM_THREADS=8\n")
    pack = build(tmp_path / "r2.evidence", keys, hostvars(hashlib.sha256(env.read_bytes()).hexdigest()))
    assert grep(pack) == []
    record = json.loads((pack / "evidence.json").read_text())
    assert record["nodes"][1]["rollback"]["why"].endswith(f"(sent with {mu.WITHHELD})")
    assert record["nodes"][0]["files_sha256"]["atlas-serving.env"] == hashlib.sha256(env.read_bytes()).hexdigest()


def test_atlasctl_finishes_a_pack_the_playbook_could_not(tmp_path: Path, keys, monkeypatch) -> None:
    """A node lost alone in its batch leaves the pack as the last batch wrote it ('in progress'): atlasctl
    rollout finishes it from its report, signed with the key the record names, beside its report."""
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    inv = tmp_path / "inv"
    inv.mkdir()
    hv = hostvars()
    del hv["n2"]["rollout_failure"]
    seen: dict = {}

    def run_fn(playbook, inventory, *, extravars, limit, on_event):
        seen.update(extravars)
        build(Path(extravars["rollout_evidence_dir"]), keys, hv)  # what the playbook wrote after wave 1
        on_event({"event": "runner_on_ok", "event_data": {"task": "Rollout | plan | the waves", "host": "localhost",
                                                          "res": {"ansible_facts": {"rollout_plan": PLAN}}}})
        on_event({"event": "playbook_on_play_start", "event_data": {"play": "Rollout | wave 2"}})
        on_event({"event": "runner_on_unreachable", "event_data": {"host": "n2", "task": "Rollout | node | drain",
                                                                   "res": {"msg": "ssh: connect: no route"}}})
        return RunResult("failed", 4, {}, tmp_path, 1.0)

    report = rollout.run(inv, "r2", run_fn=run_fn)
    pack = Path(report["evidence"]["dir"])
    assert pack.parent == Path(report["report"]).parent and pack.name == Path(report["report"]).stem + ".evidence"
    assert report["evidence"]["signed"] and report["evidence"]["status"] == "failed"
    record = evidence.read(pack)
    assert record["complete"] and record["nodes"][1]["result"] == "lost"
    assert "no route" in record["nodes"][1]["note"] and record["failure"]["gate"] == "unreachable"
    assert evidence.verify(pack, keyring=keys[2], fingerprint=keys[0].fingerprint).ok


def test_verify_against_the_key_the_inventory_names(tmp_path: Path, keys, capsys) -> None:
    controller, _, _ = keys
    pack = build(tmp_path / "r2.evidence", keys)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"vars": {"atlas_evidence_signing_key": controller.fingerprint,
                                                    "atlas_evidence_gnupg_home": str(controller.path)},
                                           "children": {"atlas_nodes": {"hosts": {"n1": {}}}}}}))
    assert cli.main(["evidence", "verify", str(pack), "-i", str(inv)]) == exitcodes.OK
    other = tmp_path / "other.yml"
    other.write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": {"n1": {}}}}}}))
    assert cli.main(["evidence", "verify", str(pack), "-i", str(other)]) == exitcodes.USAGE
    assert "names no atlas_evidence_signing_key" in capsys.readouterr().err


# ---------------------------------------------------------------- the playbook side, without atlasctl

def _playbook(tmp: Path, play: str, inventory: dict, *extra: str) -> subprocess.CompletedProcess:
    (tmp / "play.yml").write_text(play)
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
           "ANSIBLE_STDOUT_CALLBACK": "default", "ATLAS_ROLLOUT_DIR": str(tmp / "rollouts")}
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml"), *extra],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)


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
    assert grep(pack) == [] and API_KEY not in proc.stdout + proc.stderr


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


def test_the_gates_of_a_platform_move_are_recorded_where_it_moved() -> None:
    moved = {"stop": True, "hdk": ["firmware", "driver"], "cann": True, "moves": True}
    gates = [g["gate"] for g in mu._gates("ok", False, ["n1"], {}, {}, {}, moved)]
    assert gates == ["previous", "drain", "stop", "driver", "cann", "stage", "restart", "health", "slo", "enable"]
    assert [g["gate"] for g in mu._gates("ok", False, ["n1"], {}, {}, {}, {})] == [
        "previous", "drain", "stage", "restart", "health", "slo", "enable"]
    failed = mu._gates("failed", False, ["n1", "n2"], {"gate": "driver", "why": "npu-smi fails"}, {}, {}, moved)
    assert [(g["gate"], g["result"]) for g in failed][:5] == [
        ("previous", "passed"), ("network", "passed"), ("drain", "passed"), ("stop", "passed"), ("driver", "failed")]
