"""Fuzz of every atlasctl entry point (docs/security.md, "Threat model per entry point"), in process: arguments and
input files from Hypothesis, control characters and odd names among them. Each run ends in exit 0, 1 or 2, with
no traceback, and writes nothing outside its target directory (HOME and the working directory are throwaway
folders, snapshotted before and after).

What reaches a network or a node is made to fail fast here: ansible-inventory's listing is read from the YAML
file directly, a playbook run is refused, sockets refuse to connect, and ssh/rsync/scp answer as an unreachable
host does. The parsing of the arguments and of the input files is what is fuzzed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlasctl import cli, rollout
from atlasctl import inventory as shared
from atlasctl.errors import AtlasError, UsageError

ALLOWED = {0, 1, 2}
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text an operator, an inventory or a node may hand over: mostly names, some control and bidi characters.
ODD = "\u202e\u2066\x1b\r\n\t\x00\x7f\u2028\ufeff"
NAME = st.text(alphabet=st.sampled_from("abcz019-_./: " + ODD), min_size=0, max_size=16)
WORD = st.text(alphabet=st.sampled_from("abcz019-_."), min_size=1, max_size=12)
BLOB = st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | NAME,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAME, inner, max_size=3),
                       max_leaves=12)
INVENTORY = st.one_of(
    BLOB,
    st.builds(lambda hosts, vars_: yaml.safe_dump({"all": {"vars": vars_, "children": {
        "atlas_nodes": {"hosts": {h: {} for h in hosts}}}}}),
        st.lists(NAME, max_size=3), st.dictionaries(WORD, JSONISH, max_size=3)),
)


# ---------------------------------------------------------------- the sandbox

def _listing(inventory: Path, limit: str | None = None) -> dict:
    """ansible-inventory --list of a one-file YAML inventory, without ansible-inventory."""
    try:
        data = yaml.safe_load(Path(inventory).read_text(encoding="utf-8", errors="replace"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"inventory {inventory}: not YAML ({str(exc)[:80]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("all"), dict):
        raise UsageError(f"inventory {inventory}: no group all")
    out: dict = {"_meta": {"hostvars": {}}}

    def walk(name: str, group: dict, inherited: dict) -> None:
        group = group if isinstance(group, dict) else {}
        vars_ = {**inherited, **(group.get("vars") if isinstance(group.get("vars"), dict) else {})}
        hosts = group.get("hosts") if isinstance(group.get("hosts"), dict) else {}
        children = group.get("children") if isinstance(group.get("children"), dict) else {}
        out[name] = {"hosts": [str(h) for h in hosts], "children": [str(c) for c in children]}
        for host, hv in hosts.items():
            out["_meta"]["hostvars"].setdefault(str(host), {}).update({**vars_, **(hv if isinstance(hv, dict) else {})})
        for child, sub in children.items():
            walk(str(child), sub, vars_)

    walk("all", data["all"], {})
    return out


def _refused(*_args, **_kwargs):
    raise AtlasError("fuzz: no playbook runs here")


def _no_connect(*_args, **_kwargs):
    raise ConnectionRefusedError("fuzz: no network here")


REMOTE = {"ssh", "scp", "rsync", "sftp", "ansible-playbook", "ansible-runner"}


def _remote(argv) -> bool:
    first = argv[0] if isinstance(argv, (list, tuple)) and argv else argv if isinstance(argv, str) else ""
    return os.path.basename(str(first)).split()[0] in REMOTE if first else False


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    real_run, real_popen = subprocess.run, subprocess.Popen

    def run(argv, *args, **kwargs):
        if _remote(argv):
            return subprocess.CompletedProcess(argv, 255, "", "ssh: connect to host: Connection refused")
        return real_run(argv, *args, **kwargs)

    class Popen(real_popen):
        def __init__(self, argv, *args, **kwargs):
            if _remote(argv):
                raise ConnectionRefusedError("fuzz: no remote command here")
            super().__init__(argv, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shared, "listing", _listing)
        for module in ("atlasctl.runner", "atlasctl.commands.health", "atlasctl.maintenance", "atlasctl.rollout"):
            mp.setattr(f"{module}.run_playbook", _refused, raising=False)
        mp.setitem(rollout.run.__kwdefaults__, "run_fn", _refused)
        mp.setattr(socket.socket, "connect", _no_connect)
        mp.setattr(socket, "create_connection", _no_connect)
        mp.setattr(subprocess, "run", run)
        mp.setattr(subprocess, "Popen", Popen)
        yield


class Sandbox:
    """HOME, the working directory and the target directory of one run, all throwaway."""

    def __init__(self, root: Path):
        self.root = root
        self.home, self.cwd, self.out = root / "home", root / "cwd", root / "out"
        for path in (self.home, self.cwd, self.out):
            path.mkdir(parents=True, exist_ok=True)

    def file(self, name: str, text: str) -> Path:
        path = self.cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        return path

    def snapshot(self) -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(self.root)): (p.stat().st_size, p.stat().st_mtime_ns)
                for folder in (self.home, self.cwd) for p in folder.rglob("*") if not p.is_symlink()}


@contextlib.contextmanager
def _env(box: Sandbox) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(box.cwd)
        mp.setenv("HOME", str(box.home))
        for name in ("ATLAS_STATE_DIR", "ATLAS_ROLLOUT_DIR", "ATLAS_CACHE_DIR", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            mp.setenv(name, str(box.out / name.lower()))
        yield


def run_cli(box: Sandbox, argv: list[str], allowed: set[int] = ALLOWED) -> tuple[int, str]:
    """cli.main(argv) in the sandbox: (exit code, stderr); it wrote nothing in HOME or the working directory."""
    before = box.snapshot()
    out, err = io.StringIO(), io.StringIO()
    with _env(box), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    text = err.getvalue()
    assert "Traceback" not in text, f"{argv!r}\n{text}"
    assert code in allowed, f"{argv!r} exited {code}\n{text}"
    assert box.snapshot() == before, f"{argv!r} wrote outside its target directory"
    return code, text


@pytest.fixture
def box(tmp_path_factory: pytest.TempPathFactory, offline) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("fuzz"))


def _maybe(flag: str, value: st.SearchStrategy) -> st.SearchStrategy:
    """No ``flag``, or ``flag`` with a value drawn from ``value``."""
    return st.one_of(st.just([]), value.map(lambda v: [flag, v]))


# ---------------------------------------------------------------- evidence

@SETTINGS
@given(record=st.one_of(BLOB, JSONISH.map(lambda v: json.dumps(v)),
                        st.integers(60, 200).map(lambda n: "[" * n + "]" * n)),
       sums=BLOB, extra=st.lists(st.sampled_from(["--allow-unsigned", "--allow-unbound", "--json"]), max_size=3),
       rollout_id=_maybe("--rollout", NAME))
def test_evidence_verify(box: Sandbox, record: str, sums: str, extra: list, rollout_id: list) -> None:
    pack = box.cwd / "r.evidence"
    box.file("r.evidence/evidence.json", record)
    box.file("r.evidence/SHA256SUMS", sums)
    run_cli(box, ["evidence", "verify", str(pack), *extra, *rollout_id])


@SETTINGS
@given(record=st.one_of(JSONISH.map(lambda v: {"format": "atlas-serving rollout evidence 2", "nodes": v,
                                                "plan": v, "signature": v}),
                        st.dictionaries(st.sampled_from(["nodes", "plan", "rollbacks", "failure", "signature",
                                                         "controller", "bundle", "binding", "release"]),
                                        JSONISH, max_size=5).map(lambda d: {**d, "format":
                                                                            "atlas-serving rollout evidence 1"})),
       flags=st.lists(st.sampled_from(["--json", "--html", "--fingerprint"]), max_size=2, unique=True))
def test_evidence_show(box: Sandbox, record: dict, flags: list) -> None:
    box.file("r.evidence/evidence.json", json.dumps(record))
    argv = ["evidence", "show", str(box.cwd / "r.evidence")]
    for flag in flags:
        argv += {"--json": ["--json"], "--html": ["--html", str(box.out / "page.html")],
                 "--fingerprint": ["--fingerprint", "A" * 40]}[flag]
    run_cli(box, argv)


# ---------------------------------------------------------------- bundle

@SETTINGS
@given(spec=BLOB, out=NAME)
def test_bundle_build(box: Sandbox, spec: str, out: str) -> None:
    run_cli(box, ["bundle", "build", "--spec", str(box.file("spec.yml", spec)), "--out", str(box.out / out)])


@SETTINGS
@given(manifest=st.one_of(BLOB, JSONISH.map(lambda v: json.dumps(v))), flags=st.sampled_from(
    [["--allow-unsigned"], ["--allow-unsigned", "--json"], ["--fingerprint", "A" * 40]]))
def test_bundle_verify(box: Sandbox, manifest: str, flags: list) -> None:
    box.file("b/manifest.json", manifest)
    run_cli(box, ["bundle", "verify", str(box.cwd / "b"), *flags])


@SETTINGS
@given(inventory=INVENTORY, dest=_maybe("--dest", NAME), limit=_maybe("--limit", NAME))
def test_bundle_push(box: Sandbox, inventory: str, dest: list, limit: list) -> None:
    box.file("b/manifest.json", "{}")
    run_cli(box, ["bundle", "push", "-i", str(box.file("hosts.yml", inventory)), "--src", str(box.cwd / "b"),
                  "--allow-unsigned", *dest, *limit])


@SETTINGS
@given(key=NAME)
def test_bundle_sign(box: Sandbox, key: str) -> None:
    box.file("b/manifest.json", "{}")
    run_cli(box, ["bundle", "sign", "--key", key, "--homedir", str(box.out / "gnupg"), str(box.cwd / "b")])


# ---------------------------------------------------------------- models

@SETTINGS
@given(names=st.lists(NAME.filter(lambda n: n.strip("./ ") and "\x00" not in n and "/" not in n), max_size=3),
       fmt=st.sampled_from(["sums", "json"]), prefix=_maybe("--prefix", NAME), workers=_maybe("--workers", NAME))
def test_models_manifest(box: Sandbox, names: list, fmt: str, prefix: list, workers: list) -> None:
    for name in names:
        box.file(f"m/{name}", name)
    run_cli(box, ["models", "manifest", str(box.cwd / "m"), "--format", fmt, "--out", str(box.out / "sums"),
                  *prefix, *workers])


@SETTINGS
@given(sums=BLOB, flags=st.lists(st.sampled_from(["--full", "--allow-extra", "--no-stamps", "--check", "--json"]),
                                 max_size=3, unique=True))
def test_models_verify(box: Sandbox, sums: str, flags: list) -> None:
    box.file("m/w.bin", "weights")
    box.file("m/sha256sums.txt", sums)
    run_cli(box, ["models", "verify", str(box.cwd / "m"), *flags])


# ---------------------------------------------------------------- config

@SETTINGS
@given(argv_text=BLOB, env_text=BLOB, profiles=st.lists(NAME, max_size=2))
def test_config_lint(box: Sandbox, argv_text: str, env_text: str, profiles: list) -> None:
    run_cli(box, ["config", "lint", "--argv-file", str(box.file("x.args", argv_text)),
                  "--env-file", str(box.file("x.env", env_text))])
    run_cli(box, ["config", "lint", *profiles])


@SETTINGS
@given(inventory=INVENTORY, profile=NAME, host=_maybe("--host", NAME))
def test_config_render(box: Sandbox, inventory: str, profile: str, host: list) -> None:
    run_cli(box, ["config", "render", "-i", str(box.file("hosts.yml", inventory)), profile, *host,
                  "--out", str(box.out / "rendered")])


@SETTINGS
@given(inventory=INVENTORY, profiles=st.lists(NAME, max_size=2), npus=_maybe("--npus", NAME),
       hbm=_maybe("--hbm-mb", NAME))
def test_config_plan(box: Sandbox, inventory: str, profiles: list, npus: list, hbm: list) -> None:
    run_cli(box, ["config", "plan", "-i", str(box.file("hosts.yml", inventory)), *profiles, *npus, *hbm])


# ---------------------------------------------------------------- fleet commands (no node is reached)

@SETTINGS
@given(inventory=INVENTORY, wait=_maybe("--wait", NAME), limit=_maybe("-l", NAME), html=st.booleans())
def test_health(box: Sandbox, inventory: str, wait: list, limit: list, html: bool) -> None:
    run_cli(box, ["health", "-i", str(box.file("hosts.yml", inventory)), *wait, *limit,
                  *(["--html", str(box.out / "h.html")] if html else [])])


@SETTINGS
@given(inventory=INVENTORY, workers=_maybe("--workers", NAME), window=_maybe("--hang-window", NAME))
def test_doctor(box: Sandbox, inventory: str, workers: list, window: list) -> None:
    run_cli(box, ["doctor", "-i", str(box.file("hosts.yml", inventory)), *workers, *window])


@SETTINGS
@given(inventory=INVENTORY, release=NAME, extra=st.lists(NAME, max_size=2), vars_text=st.none() | BLOB)
def test_rollout_plan(box: Sandbox, inventory: str, release: str, extra: list, vars_text: str | None) -> None:
    argv = ["rollout", "-i", str(box.file("hosts.yml", inventory)), "--release", release, "--plan"]
    argv += [a for e in extra for a in ("-e", e)]
    if vars_text is not None:
        argv += ["--vars", str(box.file("release.yml", vars_text))]
    run_cli(box, argv)


@SETTINGS
@given(command=st.sampled_from(["drain", "enable"]), inventory=INVENTORY, nodes=st.lists(NAME, min_size=1,
                                                                                      max_size=3))
def test_drain_and_enable(box: Sandbox, command: str, inventory: str, nodes: list) -> None:
    run_cli(box, [command, "-i", str(box.file("hosts.yml", inventory)), "--", *nodes])


@SETTINGS
@given(values=st.lists(st.tuples(st.sampled_from(["--cann", "--engine", "--engine-version", "--python", "--torch",
                                                  "--torch-npu", "--vllm"]), NAME), max_size=4),
       table=st.none() | BLOB)
def test_compat(box: Sandbox, values: list, table: str | None) -> None:
    argv = ["compat", "check", *[a for pair in values for a in pair]]
    if table is not None:
        argv += ["--table", str(box.file("compat.yml", table))]
    run_cli(box, argv)


@SETTINGS
@given(url=NAME, numbers=st.lists(st.tuples(st.sampled_from(["--concurrency", "--request-rate", "--input-len",
                                                             "--output-len", "--seed"]), NAME), max_size=3))
def test_bench(box: Sandbox, url: str, numbers: list) -> None:
    """Every request is refused at once (no network): bounded by two requests, no warm-up, a short timeout."""
    run_cli(box, ["bench", f"http://{url}", "--num-requests", "2", "--warmup", "0", "--timeout", "2", "--no-save",
                  *[a for pair in numbers for a in pair]])


@SETTINGS
@given(prometheus=NAME, window=_maybe("--window", NAME), at=_maybe("--at", NAME))
def test_live(box: Sandbox, prometheus: str, window: list, at: list) -> None:
    """Exit 3 too: a Prometheus that does not answer (none does here) is the environment's problem."""
    run_cli(box, ["live", "--prometheus", prometheus, *window, *at], ALLOWED | {3})
    run_cli(box, ["live", "--prometheus", f"http://{prometheus}", *window, *at], ALLOWED | {3})


@SETTINGS
@given(argv=st.lists(NAME, max_size=4))
def test_any_arguments_at_the_top(box: Sandbox, argv: list) -> None:
    run_cli(box, argv)
