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
from ansible_collections.atlas.serving.plugins.module_utils import paths

REPO = Path(__file__).resolve().parents[3]
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


def _files(*entries):
    uid, gid = paths.ids(*ME)
    return [(str(dest), content, mode, uid, gid) for dest, content, mode in entries]


def test_files_are_written_only_when_content_mode_or_owner_differ(tmp_path: Path) -> None:
    a, b = tmp_path / "a.env", tmp_path / "b.args"
    files = _files((a, b"A=1\n", 0o600), (b, b"--x\n", 0o640))
    actions = paths.plan_files(files)
    assert [(v, p, d) for v, p, d in actions] == [("write", str(a), None), ("write", str(b), None)]
    paths.apply_files(actions, files)
    assert a.read_bytes() == b"A=1\n" and (a.stat().st_mode & 0o777) == 0o600 and (b.stat().st_mode & 0o777) == 0o640
    assert paths.plan_files(files) == []
    b.chmod(0o644)
    changed = _files((a, b"A=2\n", 0o600), (b, b"--x\n", 0o640))
    actions = paths.plan_files(changed)
    assert [(v, p) for v, p, _ in actions] == [("write", str(a)), ("chmod", str(b))]
    assert actions[0][2] == b"A=1\n", "the content before, for the diff"
    assert paths.file_diffs(actions, changed) == [{"before": "A=1\n", "after": "A=2\n", "before_header": str(a),
                                                   "after_header": str(a)}]
    paths.apply_files(actions, changed)
    assert a.read_bytes() == b"A=2\n" and (b.stat().st_mode & 0o777) == 0o640
    assert not [p for p in tmp_path.iterdir() if ".atlas-tmp." in p.name], "no temporary file left"


def test_a_link_where_a_file_is_wanted_is_replaced_and_a_directory_is_named(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"same\n")
    link = tmp_path / "f"
    link.symlink_to(target)
    files = _files((link, b"same\n", 0o644))
    paths.apply_files(paths.plan_files(files), files)
    assert not link.is_symlink() and link.read_bytes() == b"same\n" and target.read_bytes() == b"same\n"
    (tmp_path / "d").mkdir()
    with pytest.raises(paths.PathError, match=r"d is not a regular file; a file is wanted there: move it away"):
        paths.plan_files(_files((tmp_path / "d", b"x", 0o644)))


def test_converge_orders_directories_files_links_and_inspect_reads_first(tmp_path: Path) -> None:
    rel = tmp_path / "releases" / "r1"
    files = _files((rel / "x.json", b"{}\n", 0o644))
    uid, gid = paths.ids(*ME)
    (tmp_path / "model").symlink_to("versions/abc")
    assert paths.inspect([str(tmp_path / "model"), str(tmp_path / "current")]) == {
        str(tmp_path / "model"): {"exists": True, "link": "versions/abc"},
        str(tmp_path / "current"): {"exists": False, "link": None}}
    links = [(str(tmp_path / "current"), "releases/r1"), (str(tmp_path / "x.json"), "current/x.json")]
    d, f, lk = paths.converge([str(tmp_path / "releases"), str(rel)], files, links, 0o755, uid, gid, check=True)
    assert (len(d), len(f), len(lk)) == (2, 1, 2) and not rel.exists(), "check mode plans and writes nothing"
    paths.converge([str(tmp_path / "releases"), str(rel)], files, links, 0o755, uid, gid)
    assert json.loads((tmp_path / "x.json").read_text()) == {}
    assert paths.converge([str(rel)], files, links, 0o755, uid, gid) == ([], [], [])


def test_module_files_check_diff_then_write_then_unchanged(tmp_path: Path) -> None:
    dest = tmp_path / "etc" / "unit.service"
    args = {"directories": [str(tmp_path / "etc")], "owner": ME[0], "group": ME[1],
            "files": [{"dest": str(dest), "content": "[Unit]\n", "mode": "0644", "owner": ME[0], "group": ME[1]}],
            "inspect": [str(dest)]}
    status, check = _module(tmp_path, args, "--check", "--diff")
    assert "CHANGED" in status and check["written"] == [str(dest)] and not dest.exists(), check
    assert check["inspected"] == {str(dest): {"exists": False, "link": None}}
    status, first = _module(tmp_path, args)
    assert "CHANGED" in status and dest.read_text() == "[Unit]\n"
    status, again = _module(tmp_path, args)
    assert "SUCCESS" in status and again["written"] == [] and again["changed"] is False
    bad = {**args, "files": [{**args["files"][0], "owner": "no-such-user-x"}]}
    status, failed = _module(tmp_path, bad)
    assert "FAILED" in status and "owner 'no-such-user-x' does not exist" in failed["msg"]
    status, planned = _module(tmp_path, bad, "--check")
    assert "CHANGED" in status, "check mode on a bare node: the account comes from an earlier task"


def test_prune_removes_unmanaged_matches_only_and_names_what_it_cannot(tmp_path: Path) -> None:
    d = tmp_path / "west"
    d.mkdir()
    for name in ("n1.conf", "gone.conf", ".hidden.conf", "notes.txt"):
        (d / name).write_text("x")
    (d / "old-link.conf").symlink_to("n1.conf")
    actions = paths.plan_prune([(str(d), "*.conf")], [str(d / "n1.conf")])
    assert [p for _, p, _ in actions] == [str(d / "gone.conf"), str(d / "old-link.conf")]
    assert paths.describe_prune(actions)[0] == f"remove {d / 'gone.conf'} (matches *.conf, not managed)"
    paths.apply_prune(actions)
    assert sorted(p.name for p in d.iterdir()) == [".hidden.conf", "n1.conf", "notes.txt"]
    assert paths.plan_prune([(str(d), "*.conf")], [str(d / "n1.conf")]) == []
    assert paths.plan_prune([(str(tmp_path / "missing"), "*.conf")], []) == [], "no directory, nothing stale"
    (d / "sub.conf").mkdir()
    with pytest.raises(paths.PathError, match=r"sub.conf matches '\*.conf' .* not a regular file or link"):
        paths.plan_prune([(str(d), "*.conf")], [str(d / "n1.conf")])
    with pytest.raises(paths.PathError, match=r"prune: .*notes.txt is not a directory"):
        paths.plan_prune([(str(d / "notes.txt"), "*.conf")], [])


def test_module_prune_check_diff_then_remove_then_unchanged(tmp_path: Path) -> None:
    d = tmp_path / "west"
    d.mkdir()
    (d / "gone.conf").write_text("server 10.0.0.9:8000;\n")
    args = {"directories": [str(d)], "owner": ME[0], "group": ME[1],
            "files": [{"dest": str(d / "n1.conf"), "content": "server 10.0.0.11:8000;\n", "owner": ME[0],
                       "group": ME[1]}],
            "prune": [{"path": str(d), "pattern": "*.conf"}]}
    status, check = _module(tmp_path, args, "--check", "--diff")
    assert "CHANGED" in status and check["removed"] == [str(d / "gone.conf")] and (d / "gone.conf").exists(), check
    status, first = _module(tmp_path, args)
    assert "CHANGED" in status and first["removed"] == [str(d / "gone.conf")] and not (d / "gone.conf").exists()
    assert (d / "n1.conf").read_text() == "server 10.0.0.11:8000;\n", "the managed file is kept"
    status, again = _module(tmp_path, args)
    assert "SUCCESS" in status and again["removed"] == [] and again["changed"] is False
    status, bad = _module(tmp_path, {**args, "prune": [{"pattern": "*.conf"}]})
    assert "FAILED" in status and "each prune entry needs path" in bad["msg"]
