"""atlas.serving.stage_state: a stage's fast path proves its state in one read-only call
(module_utils/stage_state.py). Each difference a full task would fix is found; all equal -> converged."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums, tree_check
from ansible_collections.atlas.serving.plugins.module_utils import stage_state as state

ME = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name

Pw = namedtuple("Pw", "pw_name pw_gid pw_shell pw_dir")
Gr = namedtuple("Gr", "gr_name gr_gid gr_mem", defaults=((),))
SYSTEM_GROUP = Gr("atlas-serving", 990)
DEVICE_GROUP = Gr("HwHiAiUser", 1000, ("atlas-serving",))  # what the driver installer made, the user appended


def _account(tmp_path: Path, *, user=None, group=SYSTEM_GROUP, shadow="atlas-serving:!:19000::::::\n",
             login_defs="SYS_GID_MAX 999\n", make_home=True, others=(), groups=()):
    home = tmp_path / "home"
    if make_home:
        home.mkdir(exist_ok=True)
    user = user or Pw("atlas-serving", 990, "/usr/sbin/nologin", str(home))
    (tmp_path / "shadow").write_text(shadow)
    (tmp_path / "login.defs").write_text(login_defs)

    def getpwnam(name):
        if user is None or name != user.pw_name:
            raise KeyError(name)
        return user

    def getgrnam(name):
        found = [g for g in (group, *others) if g is not None and g.gr_name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    return state.account_differences("atlas-serving", "atlas-serving", "/usr/sbin/nologin", str(home), "!",
                                     shadow=str(tmp_path / "shadow"), login_defs=str(tmp_path / "login.defs"),
                                     getpwnam=getpwnam, getgrnam=getgrnam, groups=groups)


def test_account_as_the_group_and_user_tasks_leave_it_is_converged(tmp_path: Path) -> None:
    assert _account(tmp_path) == []


@pytest.mark.parametrize("change, says", [
    ({"group": None}, "group atlas-serving does not exist"),
    ({"group": Gr("atlas-serving", 1500)}, "group atlas-serving (gid 1500) is not a system group"),
    ({"user": Pw("someone-else", 990, "/usr/sbin/nologin", "/x")}, "user atlas-serving does not exist"),
    ({"user": Pw("atlas-serving", 100, "/usr/sbin/nologin", "HOME")}, "has primary gid 100, not atlas-serving (990)"),
    ({"user": Pw("atlas-serving", 990, "/bin/bash", "HOME")}, "has shell /bin/bash, not /usr/sbin/nologin"),
    ({"user": Pw("atlas-serving", 990, "/usr/sbin/nologin", "/elsewhere")}, "has home /elsewhere, not"),
    ({"shadow": "atlas-serving:$6$salt$hash:19000::::::\n"}, "another password field in"),
    ({"shadow": "root:!:19000::::::\n"}, "has no entry in"),
])
def test_each_account_difference_is_found(tmp_path: Path, change: dict, says: str) -> None:
    if "user" in change and change["user"].pw_dir == "HOME":
        change["user"] = change["user"]._replace(pw_dir=str(tmp_path / "home"))
    found = _account(tmp_path, **change)
    assert any(says in line for line in found), found
    assert not any("$6$" in line for line in found), "the password field is never reported"


@pytest.mark.parametrize(("others", "found"), [
    ((DEVICE_GROUP,), []),  # converged: the user task appended the NPU device group
    ((), []),  # a node without the driver's group: the user task adds none, so nothing differs
    ((DEVICE_GROUP._replace(gr_mem=()),), ["user atlas-serving is not in group HwHiAiUser"]),  # the fast path
    ((DEVICE_GROUP._replace(gr_mem=("someone",)),), ["user atlas-serving is not in group HwHiAiUser"]),  # is not
    ((DEVICE_GROUP._replace(gr_gid=990, gr_mem=()),), []),  # its primary group: already a member
])
def test_the_npu_device_group_is_proven_only_where_the_node_has_it(tmp_path: Path, others, found) -> None:
    assert _account(tmp_path, others=others, groups=["HwHiAiUser"]) == found


def test_a_missing_home_is_a_difference(tmp_path: Path) -> None:
    assert _account(tmp_path, make_home=False) == [f"home {tmp_path / 'home'} of atlas-serving does not exist"]


def _converged_tree(tmp_path: Path) -> dict:
    """A release tree as the serving role's two paths calls leave it, and their arguments."""
    rel = tmp_path / "releases" / "r2"
    rel.mkdir(parents=True)
    (rel / "svc.env").write_text("A=1\n")
    (rel / "svc.env").chmod(0o600)
    (tmp_path / "current").symlink_to("releases/r2")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "current").symlink_to("versions/abc")
    return {"directories": [str(tmp_path / "releases"), str(rel)],
            "files": [{"dest": str(rel / "svc.env"), "content": "A=1\n", "mode": "0600", "owner": ME[0],
                       "group": ME[1]}],
            "links": [(str(tmp_path / "current"), "releases/r2")],
            "mode": 0o755, "owner": ME[0], "group": ME[1],
            "expect_links": [(str(tmp_path / "models" / "current"), "versions/abc")]}


def _paths(args: dict) -> list[str]:
    return state.path_differences(args["directories"], args["files"], args["links"], args["mode"], args["owner"],
                                  args["group"], args["expect_links"])


def test_paths_as_written_are_converged(tmp_path: Path) -> None:
    args = _converged_tree(tmp_path)
    for d in args["directories"]:
        os.chmod(d, 0o755)
    assert _paths(args) == []


@pytest.mark.parametrize("damage, says", [
    ("content", "write "),
    ("mode", "chmod "),
    ("link", "link "),
    ("model", "-> versions/old, not versions/abc"),
    ("owner", "owner 'no-such-user-x' does not exist"),
])
def test_each_path_difference_is_found(tmp_path: Path, damage: str, says: str) -> None:
    args = _converged_tree(tmp_path)
    for d in args["directories"]:
        os.chmod(d, 0o755)
    env = tmp_path / "releases" / "r2" / "svc.env"
    if damage == "content":
        env.write_text("A=2\n")
    elif damage == "mode":
        env.chmod(0o644)
    elif damage == "link":
        (tmp_path / "current").unlink()
        (tmp_path / "current").symlink_to("releases/r1")
    elif damage == "model":
        (tmp_path / "models" / "current").unlink()
        (tmp_path / "models" / "current").symlink_to("versions/old")
    elif damage == "owner":
        args["files"][0]["owner"] = "no-such-user-x"
    found = _paths(args)
    assert len(found) == 1 and says in found[0], found
    if damage == "content":
        assert "A=2" not in found[0] and "A=1" not in found[0], "content is never reported"


def _releases(tmp_path: Path, *names_by_age: str) -> Path:
    root = tmp_path / "releases"
    root.mkdir()
    for age, name in enumerate(names_by_age):  # the first is the newest
        (root / name).mkdir()
        os.utime(root / name, (1_000_000 - age * 10, 1_000_000 - age * 10))
    return root


def test_no_release_to_prune_when_at_most_keep_and_the_protected_ones_stay(tmp_path: Path) -> None:
    root = _releases(tmp_path, "r4", "r3", "r2")
    (root / ".hidden").mkdir()
    (root / "link").symlink_to("r2")
    assert state.oldest_to_prune(str(root), 3, ["r4"]) == []
    assert state.oldest_to_prune(str(tmp_path / "none"), 3, []) == []


def test_a_release_that_the_prune_would_remove_is_found(tmp_path: Path) -> None:
    root = _releases(tmp_path, "r5", "r4", "r3", "r2", "r1")
    assert state.oldest_to_prune(str(root), 3, ["r5"]) == [str(root / "r2"), str(root / "r1")]
    assert state.oldest_to_prune(str(root), 3, ["r1"]) == [str(root / "r2")], "the protected one stays"


def _run(out: str, rc: int = 0):
    calls = []

    def run(argv):
        calls.append(argv)
        return rc, out, "no such unit" if rc else ""

    return run, calls


def test_an_enabled_active_unit_is_converged() -> None:
    run, calls = _run("LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n")
    assert state.unit_differences("atlas-serving", run) == []
    assert calls[0][:2] == ["systemctl", "show"] and calls[0][-1] == "atlas-serving"


@pytest.mark.parametrize("out, says", [
    ("LoadState=loaded\nActiveState=inactive\nUnitFileState=enabled\n", "is inactive, not active"),
    ("LoadState=loaded\nActiveState=failed\nUnitFileState=enabled\n", "is failed, not active"),
    ("LoadState=loaded\nActiveState=active\nUnitFileState=disabled\n", "is disabled, not enabled"),
    ("LoadState=not-found\nActiveState=inactive\nUnitFileState=\n", "is not-found, not loaded"),
])
def test_each_unit_difference_is_found(out: str, says: str) -> None:
    found = state.unit_differences("atlas-serving", _run(out)[0])
    assert any(says in line for line in found), found


def test_a_failed_systemctl_is_a_difference() -> None:
    assert state.unit_differences("x", _run("", rc=1)[0]) == ["systemctl show x failed: no such unit"]


def test_module_reports_converged_or_the_differences_and_changes_nothing(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[3]
    args = _converged_tree(tmp_path)
    for d in args["directories"]:
        os.chmod(d, 0o755)
    opts = {"directories": args["directories"], "files": args["files"], "owner": ME[0], "group": ME[1],
            "links": [{"dest": d, "src": s} for d, s in args["links"]],
            "expect_links": [{"path": p, "target": t} for p, t in args["expect_links"]],
            "prune_oldest": {"path": str(tmp_path / "releases"), "keep": 3, "protect": ["r2"]},
            "inspect": [str(tmp_path / "current")]}

    def run(extra: dict, *flags: str) -> dict:
        env = {**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"),
               "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,",
                               "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", *flags,
                               "-m", "atlas.serving.stage_state", "-a", json.dumps({**opts, **extra})],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        assert " => " in proc.stdout, proc.stdout + proc.stderr
        return json.loads(proc.stdout.split(" => ", 1)[1].split("\n---")[0])

    ok = run({}, "--check")
    assert ok["converged"] is True and ok["differences"] == [] and ok["changed"] is False, ok
    assert ok["inspected"] == {str(tmp_path / "current"): {"exists": True, "link": "releases/r2"}}
    env = tmp_path / "releases" / "r2" / "svc.env"
    env.write_text("A=2\n")
    off = run({"files": [{**args["files"][0], "mode": "0600"}]})
    assert off["converged"] is False and off["differences"] == [f"write {env}"], off
    assert env.read_text() == "A=2\n", "the probe writes nothing"
    bad = run({"prune_oldest": {"path": str(tmp_path), "keep": "three"}})
    assert "prune_oldest needs path (a directory) and keep (a count)" in bad["msg"]


# --- mirror: what rsync --recursive --times --delete would itemize (the models stage's copy) ------------------------

RSYNC = ["rsync", "--recursive", "--times", "--perms", "--delete", "--itemize-changes", "--chmod=D0755,F0644"]
MODES = {"file_mode": 0o644, "dir_mode": 0o755}


def _rsync(src: Path, dst: Path, *flags: str) -> str:
    return subprocess.run([*RSYNC, *flags, f"{src}/", f"{dst}/"], check=True, capture_output=True,
                          text=True, timeout=60).stdout


def _mirrored(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "model.safetensors").write_bytes(b"x" * 4096)
    for path, when in ((src / "config.json", 1_700_000_000), (src / "sub" / "model.safetensors", 1_700_000_100),
                       (src / "sub", 1_700_000_200), (src, 1_700_000_300)):
        os.utime(path, (when, when))
    _rsync(src, dst)
    return src, dst


def _touch(path: Path, when: float) -> None:
    os.utime(path, (when, when))


@pytest.mark.parametrize("damage, says", [
    (lambda s, d: (d / "extra.bin").write_text("x"), "extra.bin is not in"),
    (lambda s, d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda s, d: (d / "sub" / "model.safetensors").write_bytes(b"y" * 10), "has 10 bytes, not 4096"),
    (lambda s, d: _touch(d / "config.json", 1_600_000_000), "config.json has another mtime"),
    (lambda s, d: _touch(d / "sub", 1_600_000_000), "sub has another mtime"),
    (lambda s, d: (shutil.rmtree(d / "sub"), (d / "sub").write_text("")), "sub is not a directory"),
    (lambda s, d: (s / "link").symlink_to("config.json"), "is neither a file nor a directory"),
    (lambda s, d: (d / "config.json").chmod(0o600), "config.json has mode 0600, not 0644"),
    (lambda s, d: (d / "sub").chmod(0o700), "sub has mode 0700, not 0755"),
])
def test_each_mirror_difference_is_one_rsync_would_act_on(tmp_path: Path, damage, says: str) -> None:
    src, dst = _mirrored(tmp_path)
    assert state.mirror_differences(str(src), str(dst), **MODES) == [] and _rsync(src, dst, "--dry-run") == ""
    damage(src, dst)
    _touch(src, 1_700_000_300)
    found = state.mirror_differences(str(src), str(dst), **MODES)
    assert any(says in line for line in found), found
    if "neither" not in says:  # rsync skips a symlink without --links; the fast path does not reason about it
        assert _rsync(src, dst, "--dry-run") != "", "rsync agrees that it would act"


def test_a_mirror_equal_to_the_second_is_converged_as_rsync_says(tmp_path: Path) -> None:
    src, dst = _mirrored(tmp_path)
    _touch(dst / "config.json", 1_700_000_000.4)  # same second, other nanoseconds: rsync's quick check passes
    assert state.mirror_differences(str(src), str(dst), **MODES) == [] and _rsync(src, dst, "--dry-run") == ""
    assert state.mirror_differences(str(src), str(tmp_path / "none")) == [f"{tmp_path / 'none'} does not exist"]


# --- verified: model_verify would pass from its stamps alone ---------------------------------------------------------

def _verified_tree(tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "model"
    root.mkdir()
    lines = {"md5": [], "sha256": []}
    for name, data in (("a.bin", b"a" * 5000), ("b.json", b"{}")):
        (root / name).write_bytes(data)
        for alg in lines:
            lines[alg].append(f"{hashlib.new(alg, data).hexdigest()}  {name}\n")
    for alg, text in lines.items():
        (root / f"{alg}sums.txt").write_text("".join(text))
    for path in root.iterdir():
        _touch(path, 1_700_000_000)
    time.sleep(checksums.RACY_MARGIN_NS / 1e9 + 0.05)  # ctime is now: past the racy window
    opts = {"checksum_files": [str(root / "md5sums.txt"), str(root / "sha256sums.txt")],
            "stamp_file": str(tmp_path / "stamps.json")}
    report, _ = tree_check.check_tree(str(root), **opts)
    assert not report.failed and report.stamps_written
    return root, opts


def test_a_tree_its_stamps_vouch_for_is_converged_and_nothing_is_read(tmp_path: Path, monkeypatch) -> None:
    root, opts = _verified_tree(tmp_path)
    for reader in ("hash_file", "hash_small_file"):
        monkeypatch.setattr(checksums, reader, lambda *a, **k: pytest.fail("the fast path read a file"))
    assert state.verified_differences(str(root), **opts) == []


@pytest.mark.parametrize("damage, says", [
    (lambda r, o: _touch(r / "a.bin", 1_600_000_000), "a.bin: no stamp vouches for it"),
    (lambda r, o: (r / "a.bin").unlink(), "a.bin: missing"),
    (lambda r, o: (r / "c.bin").write_text("x"), "c.bin: not in"),
    (lambda r, o: Path(o["stamp_file"]).unlink(), "b.json: no stamp vouches for it"),
    (lambda r, o: (r / "md5sums.txt").write_text("garbage\n"), "md5sums.txt"),
])
def test_each_reason_model_verify_would_read_or_fail_is_found(tmp_path: Path, damage, says: str) -> None:
    root, opts = _verified_tree(tmp_path)
    stamps_before = Path(opts["stamp_file"]).read_bytes()
    damage(root, opts)
    found = state.verified_differences(str(root), **opts)
    assert any(says in line for line in found), found
    if Path(opts["stamp_file"]).exists():
        assert Path(opts["stamp_file"]).read_bytes() == stamps_before, "the probe writes no stamp"


def test_a_stamp_file_a_run_would_rewrite_is_a_difference(tmp_path: Path) -> None:
    root, opts = _verified_tree(tmp_path)
    (root / "b.json").unlink()
    opts["checksum_files"], opts["allow_extra"] = [str(tmp_path / "only-a.txt")], True
    Path(opts["checksum_files"][0]).write_text((root / "sha256sums.txt").read_text().splitlines()[0] + "\n")
    assert state.verified_differences(str(root), **opts) == [
        f"{opts['stamp_file']}: the stamps of {root} would be rewritten"]
