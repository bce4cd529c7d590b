"""Golden renders of every shipped profile (args, env, systemd unit) and the secret handling of
`atlasctl config render`.

Regenerate after an intended change: UPDATE_GOLDEN=1 pytest tests/unit/atlasctl/test_config_render.py
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atlasctl import planner
from support.lab_additions import PROFILE_DIRS as LAB_DIRS

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"


# The product's profiles and the lab inventory's (serving_profile_dirs of inventory/lab).
@pytest.mark.parametrize("profile", planner.profile_names(LAB_DIRS))
def test_render_matches_golden(profile):
    rendered = planner.render(profile, dirs=LAB_DIRS)
    for suffix, text in ((".args", rendered.args_text), (".env", rendered.env_text),
                         (".service", rendered.unit_text)):
        path = GOLDEN / f"{profile}{suffix}"
        if os.environ.get("UPDATE_GOLDEN") == "1":
            path.write_text(text, encoding="utf-8")
        assert path.is_file(), f"{path} missing: run with UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"{profile}{suffix} differs from {path}"


def test_golden_files_are_the_shipped_and_lab_profiles_only():
    names = {p.name.rsplit(".", 1)[0] for p in GOLDEN.iterdir()}
    assert names == set(planner.profile_names(LAB_DIRS))


def test_the_product_ships_no_lab_profile():
    assert planner.profile_names() and not [n for n in planner.profile_names() if n.startswith("lab-")]
    assert {n for n in planner.profile_names(LAB_DIRS) if n.startswith("lab-")} == {
        "lab-vllm-cpu-tiny", "lab-sglang-standin-tiny"}


def test_rendered_article_profile_carries_the_article_intent_with_real_flags():
    argv = planner.render("vllm-ascend-0.11.0-llama2-70b-chat-8x64g").argv
    assert argv[:3] == ["/opt/atlas/engines/vllm-ascend-0.11.0/bin/vllm", "serve",
                        "/var/lib/atlas/models/llama-2-70b-chat-hf/current"]
    pairs = dict(zip(argv[3::1], argv[4::1], strict=False))
    assert pairs["--tensor-parallel-size"] == "8" and pairs["--block-size"] == "128"
    assert pairs["--gpu-memory-utilization"] == "0.85" and pairs["--dtype"] == "float16"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    sglang = planner.render("sglang-0.5.6-mistral-7b-4x32g").argv
    assert "--max-running-requests" in sglang and "--disable-radix-cache" not in sglang


@pytest.mark.parametrize("profile, keys", [("vllm-ascend-0.11.0-mistral-7b-8x64g", ["vault-s3cr3t"]),
                                           ("sglang-0.5.6-mistral-7b-8x64g", "vault-s3cr3t")])
def test_the_key_goes_to_its_config_file_never_on_the_command_line(tmp_path, profile, keys):
    env = {**os.environ, "ATLAS_SERVING_API_KEY": "vault-s3cr3t"}
    cmd = [sys.executable, "-m", "atlasctl", "config", "render", profile]
    shown = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert "vault-s3cr3t" not in shown.stdout + shown.stderr
    assert "--config\n/etc/atlas/serving/releases/unnamed/atlas-serving.keys.yaml\n" in shown.stdout
    assert "--api-key" not in shown.stdout and "API_KEY" not in shown.stdout
    subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, env=env, check=True)
    keyfile = tmp_path / "atlas-serving.keys.yaml"
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o640
    assert json.loads(keyfile.read_text()) == {"api-key": keys}
    assert "vault-s3cr3t" not in (tmp_path / "atlas-serving.args").read_text()
    assert "vault-s3cr3t" not in (tmp_path / "atlas-serving.env").read_text()


def _inventory_with(tmp_path: Path, flags: dict) -> Path:
    """An inventory whose profile directory holds p.yml: the lab's vLLM profile with ``flags`` added."""
    (tmp_path / "inv/profiles").mkdir(parents=True)
    hosts = tmp_path / "inv/hosts.yml"
    hosts.write_text("all: {hosts: {n1: {serving_profile: p, serving_profile_dirs: [profiles]}}}\n")
    profile = yaml.safe_load((LAB_DIRS[0] / "lab-vllm-cpu-tiny.yml").read_text())
    profile["__serving_profile"]["flags"].update(flags)
    (tmp_path / "inv/profiles/p.yml").write_text(yaml.safe_dump(profile))
    return hosts


@pytest.mark.parametrize("expression", [
    "{{ cycler.__init__.__globals__.os.popen('id > %s').read() }}",
    "{{ lipsum.__globals__['os'].popen('id > %s').read() }}",
    "{%% set x = cycler.__init__.__globals__.os.popen('id > %s').read() %%}m",
])
def test_a_profile_is_data_not_a_template_render_and_lint_run_nothing(tmp_path, expression):
    proof = tmp_path / "ran"
    hosts = _inventory_with(tmp_path, {"--served-model-name": expression % proof})
    for action in ("render", "lint"):
        run = subprocess.run([sys.executable, "-m", "atlasctl", "config", action, "p", "-i", str(hosts)],
                             capture_output=True, text=True)
        assert run.returncode == 2, run.stdout + run.stderr
        assert "p.yml: flags['--served-model-name']" in run.stderr and "is a template" in run.stderr
        assert "Traceback" not in run.stderr
    assert not proof.exists(), "a profile string ran a command on the controller"


def test_render_out_replaces_a_link_never_writes_through_it(tmp_path):
    victim = tmp_path / "someone-elses-file"
    victim.write_text("theirs\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "atlas-serving.env").symlink_to(victim)
    (out / "atlas-serving.args").write_text("stale\n")
    profile = "vllm-ascend-0.11.0-mistral-7b-8x64g"
    run = subprocess.run([sys.executable, "-m", "atlasctl", "config", "render", profile, "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert victim.read_text() == "theirs\n"
    env = out / "atlas-serving.env"
    assert not env.is_symlink() and stat.S_IMODE(env.stat().st_mode) == 0o600
    assert env.read_text() == (GOLDEN / f"{profile}.env").read_text()
    assert (out / "atlas-serving.args").read_text() == (GOLDEN / f"{profile}.args").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["atlas-serving.args", "atlas-serving.env",
                                                     "atlas-serving.service"]  # no staging directory left


def test_render_out_refuses_a_link_as_the_directory(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    run = subprocess.run([sys.executable, "-m", "atlasctl", "config", "render", "vllm-ascend-0.11.0-mistral-7b-8x64g",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2 and "is a symbolic link" in run.stderr, run.stderr
    assert not list((tmp_path / "elsewhere").iterdir())
