"""The node layout has one definition (roles/layout/defaults/main.yml) that every tool follows."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from atlasctl import layout, planner
from atlasctl.doctor import checks, gather
from atlasctl.doctor.inventory import target
from atlasctl.doctor.model import Evidence, Section
from support.lab_additions import PROFILE_DIRS as LAB_DIRS

ROOT = Path(__file__).resolve().parents[3]
MOVED = {"serving_config_dir": "/srv/atlas/etc/serving", "models_root": "/srv/atlas/models",
         "models_name": "atlas-tiny-llama"}
DEFAULT_PATHS = ("/etc/atlas/serving", "/var/lib/atlas/models", "/var/lib/atlas/stamps", "/opt/atlas/engines",
                 "/var/lib/atlas/serving", "/opt/atlas/bin")


def test_defaults_resolve_to_the_documented_layout():
    v = layout.resolve({"models_name": "m"})
    assert v["serving_record"] == "/etc/atlas/serving/atlas-serving.json"
    assert v["serving_env_file"] == "/etc/atlas/serving/atlas-serving.env"
    assert v["serving_release_dir"] == "/etc/atlas/serving/releases"
    assert v["models_path"] == "/var/lib/atlas/models/m/current"
    assert v["models_stamp_dir"] == v["engines_stamp_dir"] == "/var/lib/atlas/stamps"


def test_inventory_overrides_move_every_derived_path():
    v = layout.resolve({**MOVED, "serving_service_name": "bank-llm", "unrelated": "x"})
    assert v["serving_record"] == "/srv/atlas/etc/serving/bank-llm.json"
    assert v["serving_args_file"] == "/srv/atlas/etc/serving/bank-llm.args"
    assert v["serving_release_dir"] == "/srv/atlas/etc/serving/releases"
    assert v["models_path"] == "/srv/atlas/models/atlas-tiny-llama/current"
    assert "unrelated" not in v


def test_a_value_that_needs_an_undefined_variable_stays_unresolved():
    v = layout.resolve({})
    assert "{{" in v["models_home"] and v["models_root"] == "/var/lib/atlas/models"


def test_doctor_reads_where_the_hosts_inventory_puts_things():
    moved = target("n1", {"ansible_host": "10.0.0.1", **MOVED}).layout
    assert moved.record == "/srv/atlas/etc/serving/atlas-serving.json" and moved.models_root == "/srv/atlas/models"
    script = gather.script(gather.snippets(moved))
    assert "/srv/atlas/etc/serving/atlas-serving.env" in script and "/srv/atlas/models" in script
    assert "/etc/atlas/serving" not in script and "/var/lib/atlas/models" not in script
    assert target("n2", {}).layout == layout.default_layout()


def test_doctor_judges_the_moved_env_file():
    moved = layout.Layout.of(MOVED)
    ev = Evidence("n1", {"modes": Section(0, f"{moved.env_file} 644 root root\n{moved.args_file} 640 root x")}, moved)
    found = checks.check_file_modes(ev, checks.default_context())
    assert [f.check for f in found] == ["env-file-mode"] and moved.env_file in found[0].evidence
    at_default = Evidence("n1", ev.sections)  # the same lines judged with the default layout: not its files
    assert checks.check_file_modes(at_default, checks.default_context()) == []


def test_config_render_follows_the_layout():
    unit = planner.render("lab-vllm-cpu-tiny", overrides={"serving_config_dir": "/srv/cfg"}, dirs=LAB_DIRS).unit_text
    assert "EnvironmentFile=/srv/cfg/atlas-serving.env" in unit
    name = "vllm-ascend-0.11.0-mistral-7b-8x64g"
    argv = planner.render(name, overrides={"models_root": "/srv/models"}).argv
    assert argv[2] == f"/srv/models/{planner.load_profile(name)['model']}/current"


def _product_files() -> list[Path]:
    files = [*ROOT.glob("roles/*/**/*.yml"), *ROOT.glob("roles/*/**/*.j2"), *ROOT.glob("playbooks/**/*.yml"),
             *ROOT.glob("tools/atlasctl/**/*.py"), ROOT / "site.yml"]
    return [p for p in files if not p.is_relative_to(ROOT / "roles/layout")]


def test_no_role_playbook_or_tool_but_the_layout_names_its_paths():
    pattern = re.compile("|".join(re.escape(p) + r"(?![\w-])" for p in DEFAULT_PATHS))
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in _product_files()
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_layout_file_names_every_default_path():
    text = yaml.safe_dump(layout.defaults())
    assert all(p in text for p in DEFAULT_PATHS)
