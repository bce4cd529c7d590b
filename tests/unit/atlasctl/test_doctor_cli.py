"""atlasctl doctor: evidence script and its parser, inventory SSH settings, report and exit codes."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import exitcodes, layout
from atlasctl.commands import doctor
from atlasctl.doctor import checks, gather, inventory, parse, report
from atlasctl.doctor.model import ERROR, WARNING, Evidence, Finding, Section
from atlasctl.errors import UsageError
from support.engine_double import engines, metrics


def test_script_output_splits_into_sections_with_exit_codes():
    sections = (("one", "echo hello; echo world"), ("two", "printf 'no newline'; exit 3"),
                ("three", "echo err >&2; true"))
    out = subprocess.run(["bash", "-c", gather.script(sections)], capture_output=True, text=True, check=True).stdout
    ev = gather.split_sections("h", out)
    assert ev.sections == {"one": Section(0, "hello\nworld"), "two": Section(3, "no newline"),
                           "three": Section(0, "err")}


def test_cut_off_output_marks_the_open_section_failed():
    text = f"{gather.MARK} npu\n| npu-smi 25.5.0 |\n"
    assert gather.split_sections("h", text).section("npu") == Section(255, "| npu-smi 25.5.0 |")


def test_node_side_redaction_of_env_and_args(tmp_path):
    """The sed expressions the script runs on the node blank the key before it leaves the node."""
    env, args = tmp_path / "e.env", tmp_path / "a.args"
    env.write_text("VLLM_API_KEY=sk-secret-1\nHF_HUB_OFFLINE=1\n")
    args.write_text("bin/python\n--api-key\nsk-secret-2\nsk-secret-4\n--port\n30000\n--api-key=sk-secret-3\n")
    moved = dataclasses.replace(layout.default_layout(), env_file=str(env), args_file=str(args))
    snippets = dict(gather.snippets(moved))
    env_cmd, args_cmd = snippets["env"], snippets["args"]
    out = subprocess.run(["bash", "-c", gather.script((("env", env_cmd), ("args", args_cmd)))],
                         capture_output=True, text=True, check=True).stdout
    assert "sk-secret" not in out
    ev = gather.split_sections("h", out)
    assert ev.text("env") == "VLLM_API_KEY=<redacted>\nHF_HUB_OFFLINE=1"
    assert ev.text("args").splitlines() == ["bin/python", "--api-key", "<redacted>", "<redacted>", "--port", "30000",
                                            "--api-key=<redacted>"]


# --- the hang check, run on "the node" (this machine) against a stand-in engine --------------------------


def _node_files(tmp_path, port, instance=None, keys=("sk-hang-1", "sk-hang-2")):
    """A node's record, args file (its --config keys file) and env file; the layout pointing at them."""
    keys_file = tmp_path / "atlas-serving.keys.yaml"
    keys_file.write_text(json.dumps({"api-key": list(keys)}))
    record = {"port": port, "served_model_name": "tiny", "release_id": "r1", "engine": "vllm",
              **({"instance": instance} if instance else {})}
    (tmp_path / "atlas-serving.json").write_text(json.dumps(record))
    (tmp_path / "atlas-serving.args").write_text(f"# Ansible managed\nbin/vllm\nserve\n--config\n{keys_file}\n")
    (tmp_path / "atlas-serving.env").write_text("HF_HUB_OFFLINE=1\n")
    return dataclasses.replace(layout.default_layout(), record=str(tmp_path / "atlas-serving.json"),
                               args_file=str(tmp_path / "atlas-serving.args"),
                               env_file=str(tmp_path / "atlas-serving.env"))


def _run_hang_section(moved, window=0.5):
    hang = dict(gather.snippets(moved, hang_window_s=window))["hang"]
    out = subprocess.run(["bash", "-c", gather.script((("hang", hang),))], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return out, gather.split_sections("atlas-n4", out, moved)


def test_the_hang_check_on_the_node_finds_a_hung_engine_with_its_key_and_never_shows_the_key(tmp_path):
    with engines() as start:
        url, handler = start(key="sk-hang-1", hold_s=60, metrics=[metrics(running=1)])
        moved = _node_files(tmp_path, int(url.rsplit(":", 1)[1]),
                            {"name": "ds", "nodes": ["atlas-n4", "atlas-n5"], "rank": 0, "head": "atlas-n4",
                             "entry": True})
        out, ev = _run_hang_section(moved)
    assert "sk-hang" not in out
    seen = json.loads(ev.text("hang"))
    # the completion was let in with the node's key (a refused one answers 401 at once) and held past its deadline
    assert seen["completion"] == {**seen["completion"], "status": None, "error": "no answer within 0.5 s"}
    assert [p for _, p, _ in handler.seen if p != "/metrics"] == ["/v1/completions"]
    assert [b for _, p, b in handler.seen if p == "/v1/completions"] == [
        {"model": "tiny", "prompt": "Hello", "max_tokens": 1, "temperature": 0}]
    [finding] = checks.check_instance_hung(ev, None)
    assert (finding.check, finding.severity) == ("instance-hung", ERROR)
    assert finding.message.startswith(f"engine hung at http://127.0.0.1:{url.rsplit(':', 1)[1]} (instance ds, entry "
                                      "atlas-n4, ranks atlas-n4, atlas-n5): no progress counter moved")
    assert "vllm:generation_tokens_total=40" in finding.evidence and "playbooks/recover.yml" in finding.fix


def test_the_hang_check_on_the_node_passes_a_healthy_engine(tmp_path):
    with engines() as start:
        url, _ = start(metrics=[metrics(tokens=40), metrics(tokens=41)])
        _, ev = _run_hang_section(_node_files(tmp_path, int(url.rsplit(":", 1)[1])))
    seen = json.loads(ev.text("hang"))
    assert seen["completion"]["status"] == 200 and seen["window_s"] >= 0.5
    assert checks.check_instance_hung(ev, None) == []


@pytest.mark.parametrize("instance, skipped", [
    ({"name": "ds", "nodes": ["a", "b"], "rank": 1, "head": "a", "entry": False},
     "rank 1 of ds: checked on its entry a"),
    ("no record", "no service record"),
])
def test_the_hang_check_asks_nothing_of_a_non_head_rank_or_a_node_without_a_record(tmp_path, instance, skipped):
    with engines() as start:
        url, handler = start()
        moved = _node_files(tmp_path, int(url.rsplit(":", 1)[1]), instance if isinstance(instance, dict) else None)
        if instance == "no record":
            (tmp_path / "atlas-serving.json").unlink()
        _, ev = _run_hang_section(moved)
    assert skipped in json.loads(ev.text("hang"))["skipped"] and handler.seen == []
    assert checks.check_instance_hung(ev, None) == []


def test_the_hang_section_is_gathered_only_with_a_window():
    assert "hang" not in dict(gather.snippets())
    assert "hang" not in dict(gather.snippets(hang_window_s=0))
    scripts = []

    def run(t, script):
        scripts.append(script)
        return ""

    gather.gather_all([inventory.Target("a", "a", "root", 22, None, ())], run, hang_window_s=7.5)
    assert f"{gather.MARK} hang" in scripts[0] and " 7.5" in scripts[0]


@pytest.mark.parametrize("text, value", [("10", 10.0), ("0", 0.0), ("60", 60.0), ("2.5", 2.5)])
def test_hang_window_takes_seconds_from_0_to_60(text, value):
    assert doctor.hang_window(text) == value


@pytest.mark.parametrize("text, says", [("61", "not between 0 (off) and 60"), ("-1", "not between"),
                                        ("ten", "'ten' is not a number of seconds")])
def test_hang_window_refuses_what_the_ssh_timeout_cannot_hold(text, says):
    with pytest.raises(Exception, match=re.escape(says)):
        doctor.hang_window(text)
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "doctor", "-i", "x", "--hang-window", text],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == exitcodes.USAGE and says in proc.stderr
def test_npu_procs_section_runs_the_collections_scan_on_the_node():
    """One command: the collection's npu_procs.py, run by python3 -c with the layout's engines root."""
    moved = dataclasses.replace(layout.default_layout(), engines_root="/srv/atlas/engines")
    command = dict(gather.snippets(moved))["npu_procs"]
    assert command.startswith("python3 -c ") and command.endswith(" /srv/atlas/engines")
    out = subprocess.run(["bash", "-c", gather.script((("npu_procs", command),))], capture_output=True, text=True,
                         check=True).stdout
    scanned = parse.npu_procs(gather.split_sections("h", out))
    assert scanned is not None and isinstance(scanned["unreadable"], list)


NPU_SMI_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "npu_smi"
# A stand-in npu-smi printing the real 910B layouts (a tab before every `-l` and `-t board` line): `info -l` as
# $LIST has it (or fails with $LIST_RC), `-t board -i <id>` the board fixture with that NPU ID; NPU $BAD fails.
FAKE_NPU_SMI = r"""#!/bin/sh
case "$*" in
  "info -l") [ "${LIST_RC:-0}" = 0 ] || { echo "dcmi module initialize failed"; exit "$LIST_RC"; }; cat "$LIST" ;;
  "info -t board -i $BAD") echo "dcmi module initialize failed. ret is -8005"; exit 2 ;;
  "info -t board -i "*) sed "s/^\(.NPU ID *: \).*/\1$5/" "$BOARD" ;;
  *) exit 9 ;;
esac
"""


def run_board_section(tmp_path, list_rc: int = 0, bad: str = "none") -> Section:
    fake = tmp_path / "npu-smi"
    fake.write_text(FAKE_NPU_SMI)
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LIST": str(NPU_SMI_FIXTURES / "list_910b_8npu.txt"),
           "LIST_RC": str(list_rc), "BOARD": str(NPU_SMI_FIXTURES / "board_910b_ok.txt"), "BAD": bad}
    command = dict(gather.snippets())["board"]
    out = subprocess.run(["bash", "-c", gather.script((("board", command),))], capture_output=True, text=True,
                         check=True, env=env).stdout
    return gather.split_sections("h", out).sections["board"]


def test_board_section_reads_every_npu_of_npu_smi_list(tmp_path):
    """The real `info -l` puts a tab before `NPU ID`: every listed NPU's board comes back, in order."""
    section = run_board_section(tmp_path)
    assert section.rc == 0 and section.text.startswith("\tNPU ID                         : 0\n")
    ev = Evidence("h", {"board": section})
    assert [b["NPU ID"] for b in parse.boards(ev)] == [str(i) for i in range(8)]
    assert all(b["Compatibility"] == "OK" and len(b) == 19 for b in parse.boards(ev))
    assert parse.board(ev)["NPU ID"] == "0"


def test_board_section_marks_an_unreadable_board_and_falls_back_to_npu_0(tmp_path):
    section = run_board_section(tmp_path, bad="3")
    assert section.rc == 0 and "npu-smi info -t board -i 3 failed (rc 2)" in section.text
    assert "dcmi" not in section.text
    assert [b["NPU ID"] for b in parse.boards(Evidence("h", {"board": section}))] == ["0", "1", "2", "4", "5", "6", "7"]
    found = checks.check_npu_compatibility(Evidence("h", {"board": section}), None)
    assert [f.severity for f in found] == [WARNING]
    assert found[0].message.startswith("NPU 3: npu-smi info -t board failed")
    alone = run_board_section(tmp_path, list_rc=1, bad="none")  # `info -l` fails: NPU 0 only
    assert [b["NPU ID"] for b in parse.boards(Evidence("h", {"board": alone}))] == ["0"]
    none = run_board_section(tmp_path, list_rc=1, bad="0")
    assert none.rc == 2 and parse.boards(Evidence("h", {"board": none})) == []


LISTING = {
    "_meta": {"hostvars": {
        "n1": {"ansible_host": "10.77.0.11", "ansible_user": "root", "ansible_ssh_private_key_file": "/k/id",
               "ansible_ssh_common_args": "-o UserKnownHostsFile=/k/known_hosts -o StrictHostKeyChecking=yes"},
        "n2": {"ansible_host": "10.77.0.12", "ansible_port": 2222},
        "gw": {"ansible_host": "10.77.0.21"},
    }},
    "all": {"children": ["ungrouped", "atlas_nodes", "gateway"]},
    "atlas_nodes": {"children": ["branch_east"], "hosts": ["n2"]},
    "branch_east": {"hosts": ["n1"]},
    "gateway": {"hosts": ["gw"]},
}


def test_targets_are_the_serving_group_with_their_ssh_settings():
    found = inventory.targets_from_listing(LISTING)
    assert [t.name for t in found] == ["n1", "n2"]
    n1, n2 = found
    assert (n1.address, n1.user, n1.port, n1.key_file, n1.known_hosts) == \
        ("10.77.0.11", "root", 22, "/k/id", ("/k/known_hosts",))
    assert n2.port == 2222 and n2.known_hosts[0].endswith("/.ssh/known_hosts") and n2.key_file is None


@pytest.mark.parametrize("args", ["-o StrictHostKeyChecking=no", "-oStrictHostKeyChecking=no",
                                  "-o 'StrictHostKeyChecking no'"])
def test_inventory_that_turns_host_keys_off_is_refused(args):
    with pytest.raises(UsageError, match="host key checking off"):
        inventory.target("n1", {"ansible_ssh_common_args": args})


def test_unreachable_host_is_named_and_exits_3():
    targets = [inventory.Target(n, n, "root", 22, None, ()) for n in ("a", "b")]

    def run(t, script):
        if t.name == "b":
            raise OSError("No route to host")
        return f"{gather.MARK} record\n{{}}\n{gather.MARK}-rc record 0\n"

    evidence, unreachable, seconds = gather.gather_all(targets, run)
    assert set(evidence) == {"a"} and "No route to host" in unreachable["b"] and seconds >= 0
    rep = report.build(["a", "b"], evidence, unreachable, checks.default_context(), seconds)
    assert rep.exit_code == exitcodes.ENVIRONMENT
    text = report.render_text(rep)
    assert "b: UNREACHABLE" in text and "unreachable: b" in text
    assert json.loads(report.render_json(rep))["hosts"]["b"]["reachable"] is False


@pytest.mark.parametrize(("severities", "code"), [((), 0), ((WARNING,), 0), ((ERROR, WARNING), 1)])
def test_exit_code_follows_the_worst_finding(severities, code):
    findings = tuple(Finding("a", "x", s, "m", "e", "f") for s in severities)
    rep = report.Report(("a",), findings, {}, 0.1)
    assert rep.exit_code == code
    assert report.render_text(rep).splitlines()[0] == ("a: healthy" if not severities else
                                                      f"a: {', '.join(f'1 {s}' for s in severities)}")


def test_json_report_lists_findings_per_host():
    ev = Evidence("a", {"npu": Section(8, "The driver is not loaded.")})
    rep = report.build(["a"], {"a": ev}, {}, checks.default_context(), 0.5)
    doc = json.loads(report.render_json(rep))
    assert doc["exit_code"] == 1 and not doc["ok"]
    assert doc["hosts"]["a"]["findings"][0]["check"] == "npu-visible"
    assert set(doc["hosts"]["a"]["findings"][0]) == {"host", "check", "severity", "message", "evidence", "fix"}


def test_cli_help_names_the_exit_codes():
    out = subprocess.run([sys.executable, "-m", "atlasctl", "doctor", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "-i INVENTORY" in out and "--json" in out and "3 a host could not be reached" in out


def test_cli_refuses_a_missing_inventory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "doctor", "-i", str(tmp_path / "nope")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == exitcodes.USAGE and "does not exist" in proc.stderr
