"""The serving role's rendering of a container release on localhost: the profile resolved with serving_runtime:
container, the image from the engines stage's fact or the record it left on the node, the ids read with getent,
and the release's files as the role renders them (args = the `podman run` line the launcher execs, env without
ASCEND_RT_VISIBLE_DEVICES, record with runtime, image and image_id; the launcher and the unit). Only read-only
tasks run here (profile, lint, container: getent of existing accounts, or check mode): no account, file or unit of
this machine is touched. The launcher itself is run with stand-ins for podman and setpriv."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import container

from support.ansible_run import ansible_env, run_playbook

pytestmark = pytest.mark.role

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "roles/serving/templates"
PROFILE = "vllm-ascend-0.11.0-llama2-70b-chat-8x64g"
IMAGE_ID = "5e" * 32
USER, GROUP, DEVICE_GROUP = "nobody", "nogroup", "daemon"  # accounts every Debian system has: read, never changed
PLAYBOOK = """
- name: serving rendering test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: profile
      ansible.builtin.include_role: {name: serving, tasks_from: profile, public: true}
    - name: lint
      ansible.builtin.include_role: {name: serving, tasks_from: lint, public: true}
    - name: container
      ansible.builtin.include_role: {name: serving, tasks_from: container, public: true}
      when: serving_runtime_resolved.runtime == 'container'
    - name: what the role renders
      ansible.builtin.copy:
        dest: "{{ result_file }}"
        mode: "0600"
        content: >-
          {{ {'args': lookup('ansible.builtin.template', templates ~ '/serving.args.j2'),
              'env': lookup('ansible.builtin.template', templates ~ '/serving.env.j2'),
              'launcher': lookup('ansible.builtin.template', templates ~ '/launcher.sh.j2'),
              'unit': lookup('ansible.builtin.template', templates ~ '/serving.service.j2'),
              'cann': lookup('ansible.builtin.template', templates ~ '/serving.cann.j2'),
              'record': __serving_record} | to_json }}
      vars:
        __serving_model_link: versions/abc123
      check_mode: false
"""


def _image(**change) -> dict:
    return {"name": "vllm-ascend-0.11.0", "image_id": IMAGE_ID, "variant": "910b", "cann": "8.3.RC2",
            "engine_release": "vllm-ascend-0.11.0", "sha256": "0" * 64} | change


class Node:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.result = tmp / "result.json"
        self.images = tmp / "engines/images"
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")

    def vars(self, **change) -> dict:
        return {
            "serving_profile": PROFILE, "serving_runtime": "container", "serving_image": "vllm-ascend-0.11.0",
            "serving_image_entrypoint": ["vllm"], "engines_image": _image(),
            "atlas_release_id": "r1", "atlas_hardware": {"npu_model": "910B3", "npu_count": 8, "hbm_mb": 65536},
            "models_name": "llama-2-70b-chat-hf", "models_root": str(self.tmp / "models"),
            "engines_root": str(self.tmp / "engines"), "serving_config_dir": str(self.tmp / "etc"),
            "serving_home": str(self.tmp / "home"), "serving_user": USER, "serving_group": GROUP,
            "serving_device_group": DEVICE_GROUP, "engines_name": "vllm-ascend", "engines_version": "0.11.0",
            "templates": str(TEMPLATES), "result_file": str(self.result),
        } | change

    def play(self, *extra: str, **change) -> subprocess.CompletedProcess:
        return run_playbook(self.tmp / "inventory.ini", self.tmp / "play.yml", "-e", json.dumps(self.vars(**change)),
                            *extra, cwd=self.tmp, env=ansible_env(self.tmp, nocolor=True))

    def rendered(self, *extra: str, **change) -> dict:
        run = self.play(*extra, **change)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        out = json.loads(self.result.read_text())
        out["argv"] = [line for line in out["args"].split("\n") if line and not line.startswith("#")]
        return out


@pytest.fixture()
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture(scope="module")
def default_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Node, dict]:
    """The container release rendered once from the default inputs, read by the tests that check that render (a
    playbook run is most of a test's time); a test that renders again does so into the same node's files."""
    default = Node(tmp_path_factory.mktemp("serving-default"))
    return default, default.rendered()


def _expected(node: Node, npus=tuple(range(8)), keys: bool = False, **change) -> list[str]:
    release = node.tmp / "etc/releases/r1"
    model = node.tmp / "models/llama-2-70b-chat-hf/current"
    engine = ["serve", str(model), "--served-model-name", "llama-2-70b-chat-hf", "--host", "localhost",
              "--port", "8000", "--tensor-parallel-size", "8", "--dtype", "float16", "--max-model-len", "2048",
              "--max-num-seqs", "10", "--enable-chunked-prefill", "--max-num-batched-tokens", "4096",
              "--gpu-memory-utilization", "0.85", "--enable-prefix-caching", "--block-size", "128"]
    if keys:
        engine += ["--config", f"{release}/atlas-serving.keys.yaml"]
    return container.run_argv({
        "podman": "/usr/bin/podman", "name": "atlas-serving", "image_id": IMAGE_ID, "npus": list(npus),
        "multinode": False, "model_source": str(model.parent / "versions/abc123"), "model_path": str(model),
        "env_file": f"{release}/atlas-serving.env", "keys_file": f"{release}/atlas-serving.keys.yaml" if keys else "",
        "uid": pwd.getpwnam(USER).pw_uid, "gid": pwd.getpwnam(USER).pw_gid,
        "device_gid": grp.getgrnam(DEVICE_GROUP).gr_gid,
        "home": str(node.tmp / "home"), "shm_size": "1g", "entrypoint": ["vllm"], "extra": [], "command": engine,
    } | change)


def test_a_container_release_renders_the_podman_run_line_env_and_record(default_release: tuple[Node, dict]) -> None:
    node, out = default_release
    assert out["argv"] == _expected(node)
    assert out["argv"][:10] == ["/usr/bin/podman", "run", "--rm", "--init", "--replace", "--name", "atlas-serving",
                                "--pull=never", "--network", "host"]
    assert "ASCEND_RT_VISIBLE_DEVICES" not in out["env"]
    assert "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in out["env"]
    assert out["record"]["runtime"] == "container"
    assert (out["record"]["image"], out["record"]["image_id"]) == ("vllm-ascend-0.11.0", IMAGE_ID)
    assert "runtime container (image vllm-ascend-0.11.0)" in out["args"]
    assert node.rendered()["args"] == out["args"], "the same inputs render the same bytes (the fast path compares them)"


def test_the_unit_and_launcher_serve_both_runtimes(default_release: tuple[Node, dict]) -> None:
    node, out = default_release
    unit = out["unit"]
    assert f"ExecStart=!{node.tmp}/" not in unit and "ExecStart=!/opt/atlas/bin/atlas-serving-launch" in unit
    assert "ExecStopPost=-+/usr/bin/podman rm -f --ignore -t 0 atlas-serving" in unit
    assert "SuccessExitStatus=143" in unit and f"User={USER}" in unit


def test_the_image_record_on_the_node_when_the_engines_stage_did_not_run(node: Node) -> None:
    node.images.mkdir(parents=True)
    (node.images / "vllm-ascend-0.11.0.json").write_text(json.dumps(_image(image_id="7a" * 32)))
    out = node.rendered(engines_image={})
    assert IMAGE_ID not in out["argv"] and "7a" * 32 in out["argv"]
    run = node.play(engines_image={}, serving_image="other")
    assert run.returncode != 0
    assert "image other is not loaded on this node" in run.stdout and "Run the engines stage first" in run.stdout


def test_an_image_of_another_release_is_refused(node: Node) -> None:
    run = node.play(engines_image=_image(engine_release="sglang-0.5.6"))
    assert run.returncode != 0
    assert ("image vllm-ascend-0.11.0 runs sglang-0.5.6, but profile vllm-ascend-0.11.0-llama2-70b-chat-8x64g is for "
            "vllm-ascend-0.11.0") in " ".join(run.stdout.split())


def test_a_subset_of_npus_and_api_keys(node: Node) -> None:
    out = node.rendered(serving_env_extra={"ASCEND_RT_VISIBLE_DEVICES": "4,5"}, serving_api_key="s3cret-key-value")
    assert out["argv"] == _expected(node, npus=(4, 5), keys=True)
    assert container.argv_npus(out["argv"]) == [4, 5] and "ASCEND_RT_VISIBLE_DEVICES" not in out["env"]
    assert "s3cret" not in out["args"] and "s3cret" not in out["env"]


def test_an_env_value_podman_would_pass_with_quotes_is_refused(node: Node) -> None:
    run = node.play(serving_env_extra={"OMP_NUM_THREADS": "4 4"}, serving_lint_override=True)
    assert run.returncode != 0 and "podman --env-file passes values literally" in run.stdout


def test_a_venv_release_renders_as_before_with_its_runtime_in_the_record(node: Node) -> None:
    out = node.rendered(serving_runtime="venv")
    venv = node.tmp / "engines/vllm-ascend-0.11.0"
    assert out["argv"][:3] == [f"{venv}/bin/vllm", "serve", str(node.tmp / "models/llama-2-70b-chat-hf/current")]
    assert "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in out["env"]
    assert out["record"]["runtime"] == "venv" and "image_id" not in out["record"]


def test_check_mode_on_a_bare_node_renders_the_names(node: Node) -> None:
    # (the account task in check mode notifies the restart handler: on a bare node the unit is pending, as here)
    out = node.rendered("--check", serving_user="atlas-no-such-user", serving_group="atlas-no-such-group",
                        serving_device_group="atlas-no-such-devices", __serving_unit_pending=True)
    at = out["argv"].index("--user")
    assert out["argv"][at:at + 4] == ["--user", "atlas-no-such-user:atlas-no-such-group", "--group-add",
                                      "atlas-no-such-devices"]
    with pytest.raises(KeyError):
        pwd.getpwnam("atlas-no-such-user")  # check mode created nothing


def test_a_node_without_the_npu_device_group_is_refused(node: Node) -> None:
    run = node.play(serving_device_group="atlas-no-such-devices")
    assert run.returncode != 0 and 'the NPU device group "atlas-no-such-devices" is not on this node' in run.stdout


def _launcher(node: Node, text: str, argv: list[str]) -> Path:
    args = node.tmp / "etc/atlas-serving.args"
    args.parent.mkdir(parents=True, exist_ok=True)
    args.write_text("# rendered\n" + "\n".join(argv) + "\n")
    launcher = node.tmp / "launch"
    launcher.write_text(text.replace("/etc/atlas/serving/atlas-serving.args", str(args)))
    return launcher


def test_the_launcher_execs_podman_as_is_and_a_venv_engine_through_setpriv(node: Node) -> None:
    log = node.tmp / "exec.log"
    stand_in = node.tmp / "stand-in"
    stand_in.write_text(f'#!/bin/sh\nprintf "%s|HOME=%s\\n" "$0 $*" "$HOME" >> {log}\n')
    stand_in.chmod(0o755)
    out = node.rendered(serving_podman=str(stand_in), serving_setpriv=str(stand_in),
                        serving_config_dir="/etc/atlas/serving")
    launcher = _launcher(node, out["launcher"], [str(stand_in), "run", "--rm", IMAGE_ID, "serve"])
    subprocess.run(["bash", str(launcher)], check=True, env={**os.environ, "HOME": "/somewhere"}, timeout=30)
    assert log.read_text().splitlines() == [f"{stand_in} run --rm {IMAGE_ID} serve|HOME={os.path.expanduser('~root')}"]
    log.unlink()
    launcher = _launcher(node, out["launcher"], ["/opt/atlas/engines/v/bin/vllm", "serve", "/m"])
    subprocess.run(["bash", str(launcher)], check=True, timeout=30)
    assert log.read_text().splitlines() == [
        f"{stand_in} --reuid={USER} --regid={GROUP} --init-groups -- /opt/atlas/engines/v/bin/vllm serve /m"
        f"|HOME={node.tmp}/home"]


def test_a_venv_release_pins_its_cann_and_the_launcher_sources_only_that(node: Node) -> None:
    """The release's own file names the pinned version's scripts (never `latest`); the launcher sources them
    before the engine; a missing one stops the start; a release without the file sources the fallback list."""
    ascend = node.tmp / "Ascend"
    pinned = [ascend / "ascend-toolkit/8.3.RC2/bin/setenv.bash", ascend / "nnal/atb/8.3.RC2/atb/set_env.sh"]
    facts = {"versions": {"8.3.RC2": {"set_env_scripts": [str(p) for p in pinned]}},
             "serving_set_env_scripts": [str(ascend / "ascend-toolkit/set_env.sh")]}
    log = node.tmp / "exec.log"
    stand_in = node.tmp / "stand-in"
    stand_in.write_text(f'#!/bin/sh\nprintf "%s\\n" "$PINNED" >> {log}\n')
    stand_in.chmod(0o755)
    play = node.play("-e", json.dumps({"ansible_facts": {"cann": facts}}), serving_runtime="venv",
                     cann_version="8.3.RC2", serving_setpriv=str(stand_in), serving_config_dir="/etc/atlas/serving")
    assert play.returncode == 0, play.stdout[-3000:]
    out = json.loads(node.result.read_text())
    assert [line for line in out["cann"].splitlines() if not line.startswith("#")] == [str(p) for p in pinned]
    assert out["record"]["cann"] == "8.3.RC2"
    cann_file = node.tmp / "etc/atlas-serving.cann"
    launcher = _launcher(node, out["launcher"].replace("/etc/atlas/serving/atlas-serving.cann", str(cann_file)),
                         ["/opt/atlas/engines/v/bin/vllm", "serve", "/m"])
    cann_file.write_text(out["cann"])
    for path in pinned:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'PINNED="${{PINNED}}{path.name} "\nexport PINNED\n')
    subprocess.run(["bash", str(launcher)], check=True, timeout=30)
    assert log.read_text().splitlines() == ["setenv.bash set_env.sh "]
    pinned[1].unlink()
    missing = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 78 and f"CANN environment script {pinned[1]} is missing" in missing.stderr
    cann_file.unlink()  # a release rendered before releases pinned their CANN
    fallback = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, timeout=30)
    assert fallback.returncode == 78 and f"{ascend / 'ascend-toolkit/set_env.sh'} is missing" in fallback.stderr


def test_a_container_release_pins_no_host_cann(node: Node) -> None:
    out = node.rendered(cann_version="8.3.RC2")
    assert "cann" not in out["record"]
    assert [line for line in out["cann"].splitlines() if not line.startswith("#")] == []


# --- the serving role: serving_lint_override does not cover an unsafe value ---------------------------------------

def test_the_serving_role_refuses_an_unsafe_value_even_with_the_override(tmp_path):
    run = Node(tmp_path).play(serving_runtime="venv", serving_env_extra={"LD_PRELOAD": "/tmp/x.so"},
                              serving_lint_override=True)
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and "`LD_PRELOAD`" in out and "serving_lint_override does not cover" in out, out[-2000:]
