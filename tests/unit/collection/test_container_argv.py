"""module_utils/container.py: the `podman run` line of a container release (tables of specs and the argv they
give), the NPUs it is given, the environment it gets, and the checks around it (chip variant, image release,
podman inspect against the args). filter/container.py: the runtime's resolution from the inventory and profile."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import container as filters
from ansible_collections.atlas.serving.plugins.module_utils import container

IMAGE = "3f" * 32
VERSION_DIR = "/var/lib/atlas/models/m/versions/abc123"
MODEL = "/var/lib/atlas/models/m/current"
RELEASE = "/etc/atlas/serving/releases/r1"
BASE = {
    "podman": "/usr/bin/podman", "name": "atlas-serving", "image_id": IMAGE, "npus": [0, 1],
    "model_source": VERSION_DIR, "model_path": MODEL, "env_file": f"{RELEASE}/atlas-serving.env",
    "keys_file": "", "uid": 990, "gid": 990, "device_gid": 1000, "home": "/var/lib/atlas/serving",
    "shm_size": "1g", "entrypoint": ["vllm"], "extra": [], "command": ["serve", MODEL, "--port", "8000"],
}
HEAD = ["/usr/bin/podman", "run", "--rm", "--init", "--replace", "--name", "atlas-serving", "--pull=never",
        "--network", "host", "--user", "990:990", "--group-add", "1000"]
CONTROL = ["--device", "/dev/davinci_manager", "--device", "/dev/devmm_svm", "--device", "/dev/hisi_hdc"]
DRIVER = ["--volume", "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro",
          "--volume", "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro",
          "--volume", "/usr/local/dcmi:/usr/local/dcmi:ro",
          "--volume", "/etc/ascend_install.info:/etc/ascend_install.info:ro"]
TAIL = ["--volume", "/var/lib/atlas/serving:/var/lib/atlas/serving:rw", "--workdir", "/var/lib/atlas/serving",
        "--env", "HOME=/var/lib/atlas/serving", "--env-file", f"{RELEASE}/atlas-serving.env", "--shm-size", "1g"]


def _model(source=VERSION_DIR):
    return ["--volume", f"{source}:{MODEL}:ro"]


@pytest.mark.parametrize("change, expected", [
    ({}, HEAD + ["--device", "/dev/davinci0", "--device", "/dev/davinci1"] + CONTROL + DRIVER + _model() + TAIL
     + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
    # a subset: exactly those devices, keeping their numbers
    ({"npus": [4, 6]}, HEAD + ["--device", "/dev/davinci4", "--device", "/dev/davinci6"] + CONTROL + DRIVER
     + _model() + TAIL + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
    # a multi-node rank: /etc/hccn.conf; hccn_tool under the driver directory is mounted with it
    ({"npus": [0], "multinode": True}, HEAD + ["--device", "/dev/davinci0"] + CONTROL + DRIVER
     + ["--volume", "/etc/hccn.conf:/etc/hccn.conf:ro"] + _model() + TAIL
     + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
    ({"npus": [0], "multinode": True, "hccn_tool": "/usr/local/bin/hccn_tool"}, HEAD + ["--device", "/dev/davinci0"]
     + CONTROL + DRIVER + ["--volume", "/etc/hccn.conf:/etc/hccn.conf:ro",
                           "--volume", "/usr/local/bin/hccn_tool:/usr/local/bin/hccn_tool:ro"] + _model() + TAIL
     + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
    # API keys: the engine's --config file mounted read-only at its own path, never a key on the line
    ({"npus": [0], "keys_file": f"{RELEASE}/atlas-serving.keys.yaml",
      "command": ["serve", MODEL, "--config", f"{RELEASE}/atlas-serving.keys.yaml"]},
     HEAD + ["--device", "/dev/davinci0"] + CONTROL + DRIVER + _model()
     + ["--volume", f"{RELEASE}/atlas-serving.keys.yaml:{RELEASE}/atlas-serving.keys.yaml:ro"] + TAIL
     + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--config", f"{RELEASE}/atlas-serving.keys.yaml"]),
    # SGLang: python3 -m sglang.launch_server; site flags before the image; no shm size
    ({"npus": [0], "entrypoint": ["python3"], "shm_size": "", "extra": ["--ulimit", "memlock=-1"],
      "command": ["-m", "sglang.launch_server", "--model-path", MODEL]},
     HEAD + ["--device", "/dev/davinci0"] + CONTROL + DRIVER + _model() + TAIL[:-2] + ["--ulimit", "memlock=-1"]
     + ["--entrypoint", '["python3"]', IMAGE, "-m", "sglang.launch_server", "--model-path", MODEL]),
    # the model path is not a link: mounted as it is
    ({"npus": [0], "model_source": ""}, HEAD + ["--device", "/dev/davinci0"] + CONTROL + DRIVER + _model(MODEL)
     + TAIL + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
    # ids from getent arrive as strings
    ({"npus": [0], "uid": "991", "gid": "992", "device_gid": "1001"},
     HEAD[:10] + ["--user", "991:992", "--group-add", "1001", "--device", "/dev/davinci0"] + CONTROL + DRIVER
     + _model() + TAIL + ["--entrypoint", '["vllm"]', IMAGE, "serve", MODEL, "--port", "8000"]),
], ids=["all", "subset", "multinode", "multinode-own-hccn-tool", "api-keys", "sglang", "model-not-a-link",
        "ids-as-strings"])
def test_run_argv(change, expected):
    assert container.run_argv(BASE | change) == expected


def test_the_bash_entrypoint_is_one_json_argument():
    shell = ["/bin/bash", "-c", 'source /usr/local/Ascend/ascend-toolkit/set_env.sh && exec "$0" "$@"', "vllm"]
    argv = container.run_argv(BASE | {"entrypoint": shell})
    at = argv.index("--entrypoint")
    assert json.loads(argv[at + 1]) == shell and argv[at + 2] == IMAGE and argv[at + 3:] == BASE["command"]


@pytest.mark.parametrize("change, says", [
    ({"image_id": "sha256:" + IMAGE}, "is not 64 hex digits"),
    ({"npus": []}, "at least one NPU"),
    ({"uid": "atlas-serving"}, "uid 'atlas-serving' is not a numeric id"),
    ({"device_gid": None}, "device_gid None is not a numeric id"),
    ({"entrypoint": []}, "serving_image_entrypoint is empty"),
    ({"name": "a b"}, "container name 'a b'"),
    ({"model_path": "relative/path"}, "the model path 'relative/path' must be an absolute path"),
    ({"home": "/a:b"}, "must be an absolute path without ':'"),
    ({"shm_size": "lots"}, "shm size 'lots'"),
    ({"command": ["serve", "a\nb"]}, "control character"),
    ({"podman": "podman"}, "podman 'podman' must be an absolute path"),
])
def test_run_argv_refuses(change, says):
    with pytest.raises(container.ContainerError, match=says):
        container.run_argv(BASE | change)


def test_check_mode_on_a_bare_node_renders_the_names():
    argv = container.run_argv(BASE | {"uid": "atlas-serving", "gid": "atlas-serving", "device_gid": "HwHiAiUser",
                                      "ids_pending": True})
    assert argv[10:14] == ["--user", "atlas-serving:atlas-serving", "--group-add", "HwHiAiUser"]


def test_no_secret_on_the_line_and_the_devices_read_back():
    argv = container.run_argv(BASE | {"keys_file": f"{RELEASE}/atlas-serving.keys.yaml"})
    assert not any("api" in token.lower() and "key" in token.lower() for token in argv if "keys.yaml" not in token)
    assert container.is_run_argv(argv) and not container.is_run_argv(["/opt/atlas/engines/v/bin/vllm", "serve"])
    assert container.argv_npus(argv) == [0, 1]
    engine_device = argv + ["--device", "npu"]  # an engine flag named --device (SGLang's) is not podman's
    assert container.argv_devices(engine_device) == ["/dev/davinci0", "/dev/davinci1", *CONTROL[1::2]]


@pytest.mark.parametrize("env, count, npus", [
    ({}, 8, list(range(8))),
    ({"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}, 8, [0, 1, 2, 3]),
    ({"ASCEND_RT_VISIBLE_DEVICES": "4, 6"}, 8, [4, 6]),
    ({"ASCEND_RT_VISIBLE_DEVICES": ""}, "4", [0, 1, 2, 3]),
    ({"ASCEND_RT_VISIBLE_DEVICES": 3}, None, [3]),
])
def test_npus(env, count, npus):
    assert container.npus(env, count) == npus


@pytest.mark.parametrize("env, count, says", [
    ({}, None, "set atlas_hardware.npu_count"),
    ({}, 0, "at least one NPU"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "0-3"}, 8, "is not a list of NPU ids"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "0,0"}, 8, "names an NPU twice"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "8"}, 8, "names an NPU the node does not have"),
])
def test_npus_refuses(env, count, says):
    with pytest.raises(container.ContainerError, match=says):
        container.npus(env, count)


def test_the_container_env_leaves_out_the_visible_devices_and_literal_values_pass():
    env = {"ASCEND_RT_VISIBLE_DEVICES": "4,5", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
           "TASK_QUEUE_ENABLE": 1, "HF_HUB_OFFLINE": True}
    assert container.container_env(env) == {k: v for k, v in env.items() if k != "ASCEND_RT_VISIBLE_DEVICES"}
    assert container.env_file_problems(env) == []
    found = container.env_file_problems({"A": "x y", "B": 'say "hi"', "C": "$HOME", "D": "ok"})
    assert [p.split("=")[0] for p in found] == ["A", "B", "C"]


@pytest.mark.parametrize("name, variant", [
    ("910B3", "910b"), ("910B1", "910b"), ("910B2C", "910b"), ("910b4", "910b"), ("Ascend910", "a3"),
    ("310P3", None), ("Ascend910B3", None), ("", None), (None, None),
])
def test_chip_variant(name, variant):
    assert container.chip_variant(name) == variant


def _image(**change):
    return {"name": "vllm", "variant": "910b", "engine_release": "vllm-ascend-0.11.0", "cann": "8.3.RC2"} | change


@pytest.mark.parametrize("image, chips, release, says", [
    (_image(), ["910B3"] * 8, "vllm-ascend-0.11.0", []),
    (_image(variant="a3"), ["Ascend910"] * 16, "vllm-ascend-0.11.0", []),
    (_image(variant="a3"), ["910B3"], "vllm-ascend-0.11.0",
     ["image vllm is built for a3 (its CANN kernels), but n1's NPUs are 910B3, which need an image of variant 910b"]),
    (_image(), ["Ascend910"], "vllm-ascend-0.11.0",
     ["image vllm is built for 910b (its CANN kernels), but n1's NPUs are Ascend910, which need an image of "
      "variant a3"]),
    (_image(), ["310P3"], "vllm-ascend-0.11.0", ["n1's NPUs are 310P3, a chip this suite does not map"]),
    (_image(), [], "vllm-ascend-0.11.0", ["n1 reports no NPU (npu-smi)"]),
    (_image(), ["910B3"], "sglang-0.5.6",
     ["image vllm runs vllm-ascend-0.11.0, but n1's serving profile is for sglang-0.5.6"]),
])
def test_image_problems(image, chips, release, says):
    found = container.image_problems(image, "n1", chips, release)
    assert len(found) == len(says) and all(s in f for s, f in zip(says, found, strict=True)), found


def _inspect(devices=("/dev/davinci0", "/dev/davinci1", *CONTROL[1::2]), driver=True, rw=False, image=IMAGE,
             partial=False, on_host=None):
    mounts = [{"Type": "bind", "Source": VERSION_DIR, "Destination": MODEL, "RW": False}]
    if driver:
        mounts.append({"Type": "bind", "Source": container.DRIVER_DIR, "Destination": container.DRIVER_DIR, "RW": rw})
    if partial:
        mounts.append({"Type": "bind", "Source": "/usr/local/Ascend/driver/lib64",
                       "Destination": "/usr/local/Ascend/driver/lib64", "RW": False})
    return {"Image": image, "Mounts": mounts,
            "HostConfig": {"Devices": [{"PathOnHost": on_host or d, "PathInContainer": d} for d in devices]}}


@pytest.mark.parametrize("inspect, checks, says", [
    (_inspect(), [], ""),
    # devices that share their numbers (the lab's doubles, 1:3): Podman names each /dev/null on the host side
    (_inspect(on_host="/dev/null"), [], ""),
    (_inspect(devices=("/dev/davinci0", *CONTROL[1::2]), on_host="/dev/null"), ["container-devices"],
     "lacks /dev/davinci1"),
    (_inspect(devices=("/dev/davinci0", *CONTROL[1::2])), ["container-devices"], "lacks /dev/davinci1"),
    (_inspect(devices=("/dev/davinci0", "/dev/davinci1", "/dev/davinci2", *CONTROL[1::2])), ["container-devices"],
     "holds /dev/davinci2"),
    (_inspect(driver=False, partial=True), ["container-driver-mount"], "only /usr/local/Ascend/driver/lib64"),
    (_inspect(rw=True), ["container-driver-mount"], "read-write"),
    (_inspect(image="ab" * 32), ["container-image"], "runs image " + "ab" * 32),
])
def test_inspect_problems(inspect, checks, says):
    found = container.inspect_problems(inspect, container.run_argv(BASE), IMAGE)
    assert [f[0] for f in found] == checks
    assert all(says in f[1] for f in found)


PROFILE = {"name": "p", "command": ["bin/vllm", "serve", "{{ serving_model_path }}"]}


@pytest.mark.parametrize("profile, args, resolved", [
    (PROFILE, ("", "", []), {"runtime": "venv", "image": None, "entrypoint": []}),
    (PROFILE | {"runtime": "container", "image_entrypoint": ["vllm"]}, ("", "img", []),
     {"runtime": "container", "image": "img", "entrypoint": ["vllm"]}),
    (PROFILE | {"runtime": "container"}, ("venv", "", []), {"runtime": "venv", "image": None, "entrypoint": []}),
    (PROFILE, ("container", "img", ["python3"]), {"runtime": "container", "image": "img", "entrypoint": ["python3"]}),
    (PROFILE | {"image_entrypoint": "vllm"}, ("container", "img", []),
     {"runtime": "container", "image": "img", "entrypoint": ["vllm"]}),
])
def test_the_inventory_wins_over_the_profile(profile, args, resolved):
    assert filters.serving_runtime(profile, *args) == resolved


@pytest.mark.parametrize("profile, args, says", [
    (PROFILE, ("docker", "", []), "serving_runtime 'docker' is not one of venv, container"),
    (PROFILE | {"runtime": "vm"}, ("", "", []), "profile p's runtime 'vm' is not one of"),
    (PROFILE, ("container", "", ["vllm"]), "serving_image is not set"),
    (PROFILE, ("container", "a/b", ["vllm"]), "is not a bundle image name"),
    (PROFILE, ("container", "img", []), "set serving_image_entrypoint"),
    (PROFILE | {"command": ["vllm", "serve"]}, ("container", "img", ["vllm"]), "not bin/<executable>"),
])
def test_a_container_release_without_what_it_needs_is_refused(profile, args, says):
    with pytest.raises(AnsibleFilterError, match=says):
        filters.serving_runtime(profile, *args)
