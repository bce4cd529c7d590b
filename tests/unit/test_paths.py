"""atlas.serving.paths: a stage's directories and links in one call (module_utils/paths.py)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from atlasctl.collection import module_utils

paths = module_utils("paths")
REPO = Path(__file__).resolve().parents[2]
ME = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name


def _plan(dirs, links=(), mode=0o755):
    uid, gid = paths.ids(*ME)
    return paths.plan([str(d) for d in dirs], [(str(d), s) for d, s in links], mode, uid, gid)


def test_missing_paths_are_planned_in_order_then_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "a" / "b"
    link = tmp_path / "a" / "l"
    actions = _plan([a, b], [(link, "b/x")])
    assert [(v, p) for v, p, _ in actions] == [("mkdir", str(a)), ("mkdir", str(b)), ("link", str(link))]
    uid, gid = paths.ids(*ME)
    paths.apply(actions, 0o755, uid, gid)
    assert os.readlink(link) == "b/x" and (b.stat().st_mode & 0o777) == 0o755
    assert _plan([a, b], [(link, "b/x")]) == []


def test_mode_owner_and_a_wrong_link_are_fixed(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    link = tmp_path / "l"
    link.symlink_to("elsewhere")
    regular = tmp_path / "r"
    regular.write_text("x")
    actions = _plan([d], [(link, "d/x"), (regular, "d/y")], mode=0o750)
    assert [v for v, _, _ in actions] == ["chmod", "link", "link"]
    paths.apply(actions, 0o750, *paths.ids(*ME))
    assert (d.stat().st_mode & 0o777) == 0o750 and os.readlink(link) == "d/x" and os.readlink(regular) == "d/y"
    assert not [p for p in tmp_path.iterdir() if ".atlas-link." in p.name], "no temporary link left"


@pytest.mark.parametrize("setup, want, says", [
    ("file", "dir", "is not a directory; a directory is wanted there"),
    ("symlink", "dir", "is a symbolic link; a directory is wanted there"),
    ("dir", "link", "is a directory; a link to t is wanted there"),
])
def test_the_wrong_kind_of_path_is_named_with_the_fix(tmp_path: Path, setup, want, says) -> None:
    p = tmp_path / "p"
    {"file": lambda: p.write_text("x"), "symlink": lambda: p.symlink_to("/"), "dir": p.mkdir}[setup]()
    with pytest.raises(paths.PathError, match=f"{p} {says}: move it away"):
        _plan([p] if want == "dir" else [], [(p, "t")] if want == "link" else [])


def test_unknown_owner_is_named() -> None:
    with pytest.raises(paths.PathError, match="owner 'no-such-user-x' does not exist"):
        paths.ids("no-such-user-x", "root")


def _module(tmp_path: Path, args: dict, *flags: str) -> tuple[str, dict]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "at"),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,",
                           "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", *flags,
                           "-m", "atlas.serving.paths", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    status, result = proc.stdout.split(" => ", 1)
    return status, json.loads(result.split("\n---")[0]) if result.lstrip().startswith("{") else {"raw": result}


def test_module_check_mode_then_apply_then_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "etc"
    args = {"directories": [str(root), str(root / "releases")], "owner": ME[0], "group": ME[1],
            "links": [{"dest": str(root / "atlas-serving.env"), "src": "current/atlas-serving.env"}]}
    status, check = _module(tmp_path, args, "--check", "--diff")
    assert "CHANGED" in status and len(check["actions"]) == 3 and not root.exists()
    status, first = _module(tmp_path, args)
    assert "CHANGED" in status and os.readlink(root / "atlas-serving.env") == "current/atlas-serving.env"
    status, again = _module(tmp_path, args)
    assert "SUCCESS" in status and again["actions"] == [] and again["changed"] is False
    status, bad = _module(tmp_path, {**args, "mode": "rwx"})
    assert "FAILED" in status and "is not an octal mode" in bad["msg"]


def test_missing_parents_are_created_with_the_same_mode(tmp_path: Path) -> None:
    deep = tmp_path / "x" / "y" / "z"
    actions = _plan([deep, tmp_path / "x" / "y"])
    assert [p for _, p, _ in actions] == [str(tmp_path / "x"), str(tmp_path / "x" / "y"), str(deep)]
    paths.apply(actions, 0o750, *paths.ids(*ME))
    assert all((p.stat().st_mode & 0o777) == 0o750 for p in (tmp_path / "x", tmp_path / "x" / "y", deep))
