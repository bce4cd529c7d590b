"""The rollout benchmark's task timer callback (atlaslab.benchmarks.rollout) in a real ansible-playbook run: the
events it records, the play times and the task profile read from them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atlaslab.benchmarks import rollout as rb

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.role


def test_timer_callback_records_a_real_playbook(tmp_path):
    plugins = tmp_path / "callback_plugins"
    plugins.mkdir()
    (plugins / "atlas_task_timer.py").write_text(rb.TIMER_CALLBACK)
    play = tmp_path / "play.yml"
    play.write_text("- name: One\n  hosts: all\n  gather_facts: false\n  tasks:\n"
                    "    - name: First\n      ansible.builtin.debug: {msg: hi}\n"
                    "    - name: Second\n      ansible.builtin.pause: {seconds: 1}\n")
    out = tmp_path / "tasks.json"
    env = {**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(plugins), "ANSIBLE_CALLBACKS_ENABLED": "atlas_task_timer",
           "ATLAS_TASK_TIMER_OUT": str(out), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(play)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rb.recap(proc.stdout)["localhost"]["ok"] == 2
    events = json.loads(out.read_text())
    assert [e["event"] for e in events] == ["playbook_on_play_start", "playbook_on_task_start",
                                            "playbook_on_task_start", "playbook_on_stats"]
    assert rb.play_times(events)[0][0] == "One"
    profile = rb.task_profile(events, play_re=re.compile(".*"))
    assert profile[0][0] == "Second" and profile[0][1] >= 1.0
