"""Filters of atlas.serving: argv and env rendering, free space, fleet table."""

from __future__ import annotations

import re

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import serving


@pytest.mark.parametrize(
    ("flags", "positional", "argv"),
    [
        ({"--max-model-len": 2048}, None, ["--max-model-len", "2048"]),
        ({"--enable-chunked-prefill": True, "--enforce-eager": False}, None, ["--enable-chunked-prefill"]),
        ({"--api-key": None}, ["serve", "/m"], ["serve", "/m"]),
        ({"--additional-config": {"b": 1, "a": {"x": True}}}, None,
         ["--additional-config", '{"a":{"x":true},"b":1}']),
        ({"--lora-modules": ["a=/x", "b=/y"]}, None, ["--lora-modules", "a=/x", "b=/y"]),
        ({"--gpu-memory-utilization": 0.85, "--dtype": "float16"}, None,
         ["--gpu-memory-utilization", "0.85", "--dtype", "float16"]),
    ],
)
def test_engine_argv(flags, positional, argv):
    assert serving.engine_argv(flags, positional) == argv


@pytest.mark.parametrize("bad", ["max-model-len", "--Max", "-x", "--page_size", 3])
def test_engine_argv_rejects_malformed_flags(bad):
    with pytest.raises(AnsibleFilterError, match="engine flag"):
        serving.engine_argv({bad: 1})


def test_env_lines_sorted_quoted_and_checked():
    lines = serving.env_lines({"TASK_QUEUE_ENABLE": 2, "A": "x y", "B": True, "C": None, "D": 'q"$'})
    assert lines == ["A=\"x y\"", "B=true", 'D="q\\"$"', "TASK_QUEUE_ENABLE=2"]
    with pytest.raises(AnsibleFilterError, match="not valid"):
        serving.env_lines({"1BAD": 1})
    with pytest.raises(AnsibleFilterError, match="newline"):
        serving.env_lines({"X": "a\nb"})


def test_fleet_table_lists_every_host_even_without_report():
    hostvars = {
        "n1": {"health_report": {"host": "n1", "service": "active", "health": "200", "model": "m"}},
        "n2": {},
    }
    lines = serving.fleet_table(["n1", "n2"], hostvars)
    assert lines[0].split()[0] == "NODE"
    assert any(line.startswith("n1") and "active" in line for line in lines)
    assert any(line.startswith("n2") and "no report" in line for line in lines)


def test_manifest_sha256_indexes_the_manifest_by_path():
    manifest = {"format": 1, "files": [{"path": "cann/a.run", "sha256": "A" * 64, "md5": "b" * 32, "size": 1},
                                       {"path": "hdk/b.zip", "sha256": "b" * 64, "size": 2,
                                        "members": [{"path": "b.run", "size": 1, "sha256": "c" * 64}]}]}
    assert serving.manifest_sha256(manifest) == {"cann/a.run": "a" * 64, "hdk/b.zip": "b" * 64,
                                                 "hdk/b.zip!b.run": "c" * 64}
    assert serving.manifest_sha256({"format": 1, "files": []}) == {}


@pytest.mark.parametrize("files, words", [
    ([{"path": "cann/a.run", "sha256": "aa", "size": 1}], "is not 64 hex characters"),
    ([{"path": "cann/a.run", "md5": "b" * 32, "size": 1}], "no 'sha256' given"),
    ([{"path": "./cann/a.run", "sha256": "a" * 64, "size": 1}], "not written as the bundle holds it"),
    ([{"path": "cann/a.run", "sha256": "a" * 64, "size": 1}] * 2, "listed twice"),
    ([{"path": "k.zip", "sha256": "a" * 64, "size": 1, "members": [{"path": "k.run", "sha256": "x"}]}],
     "members[0]: sha256 digest 'x'"),
])
def test_manifest_sha256_refuses_a_damaged_manifest_naming_it(files, words):
    with pytest.raises(AnsibleFilterError, match=re.escape(words)) as err:
        serving.manifest_sha256({"format": 1, "files": files}, "/srv/b/manifest.json")
    assert "/srv/b/manifest.json" in str(err.value) and "the bundle is damaged" in str(err.value)


def test_api_keys_current_first_and_clear_errors():
    api_keys = serving.api_keys

    assert api_keys([], "") == [] and api_keys(None, "k1") == ["k1"]
    assert api_keys(["new", "old"], "ignored") == ["new", "old"]
    for bad, words in ((["a", "a"], "twice"), ("k1", "must be a list"), (["ok", ""], r"serving_api_keys\[1\]"),
                       (["has space"], "without spaces")):
        with pytest.raises(AnsibleFilterError, match=words):
            api_keys(bad)


def test_trusted_manifest_problem_checks_the_bytes_read():
    import base64
    import hashlib

    data = b'{"format": 1, "files": []}\n'
    content = base64.b64encode(data).decode()
    verified = hashlib.sha256(data).hexdigest()
    assert serving.trusted_manifest_problem(content, verified, "/b/manifest.json") == ""
    swapped = base64.b64encode(data + b" ").decode()
    assert "is not the manifest whose signature was verified" in serving.trusted_manifest_problem(
        swapped, verified, "/b/manifest.json")
    assert "not verified in this run" in serving.trusted_manifest_problem(content, "", "/b/manifest.json")
    assert "not base64" in serving.trusted_manifest_problem("not base64!", verified, "/b/manifest.json")
