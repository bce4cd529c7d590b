#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: npu_free
short_description: Wait until a node's NPUs are free (no process holds one, no engine left, HBM back to idle)
version_added: "0.1.0"
description:
  - Before the ranks of an instance start again, polls until (a) no process holds an NPU checked - the
    rows of C(npu-smi info)'s process table and every process with a C(/dev/davinciN) open
    (C(/proc/PID/fd)), (b) no engine process is alive (its C(/proc/PID/exe) or argv[0] under
    I(engines_root)), and (c) each NPU checked uses no more HBM than I(idle_hbm_pct) of its capacity.
  - At the deadline it fails with one message naming every process left (pid, name and command line,
    the NPUs it holds, its systemd unit from C(/proc/PID/cgroup)), every NPU whose HBM is not back to
    idle (used/total) and the fix - C(systemctl stop UNIT) or C(kill PID); HCCL needs about 10 s after
    the last process exits (EJ0001); HBM held with no process left is a zombie engine (vllm-ascend
    \#9888) that only a reboot frees. See docs/multinode-serving.md, "NPUs free before a start".
  - Fails at once on a node without C(npu-smi) (no driver). Read-only; C(changed) is always false.
  - Run it as root (C(become)); other users' open files cannot be read, and the module warns when some
    could not.
options:
  wait_s:
    description: Seconds to wait for the NPUs to be free (0 looks once).
    type: int
    default: 30
  poll_s:
    description: Seconds between looks.
    type: float
    default: 1
  engines_root:
    description: Where the engine releases are installed; a process whose executable or argv[0] lies under
      it is an engine process.
    type: path
    required: true
  idle_hbm_pct:
    description: An NPU is idle when its HBM-Usage is at most this percentage of its capacity. An idle NPU
      holds what the driver reserves, about 3.3 GB - 3318 of 65536 MB on a 910B3 (5 %), 10 % of a 32 GB
      NPU; an engine left behind holds its weights and KV cache.
    type: int
    default: 15
  npu_smi:
    description: The npu-smi command (a name looked up on PATH and the driver's tools directories, or a path).
    type: str
    default: npu-smi
  devices:
    description: The NPU ids to check; default every NPU C(npu-smi info) lists. A process holding only
      other NPUs does not block.
    type: list
    elements: int
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: The NPUs are free before the rank starts again
  atlas.serving.npu_free:
    engines_root: /opt/atlas/engines
    wait_s: 60
  become: true
"""

RETURN = r"""
free:
  description: True when no process is left on the NPUs checked and each of them is back to idle.
  returned: always
  type: bool
processes:
  description: The processes left (C(pid), C(name), C(cmdline), C(npus), C(unit), C(engine), C(memory_mb) from
    npu-smi, C(seen) - C(proc) and/or C(npu-smi)).
  returned: always
  type: list
  elements: dict
npus:
  description: Each NPU checked - C(id), C(hbm_used_mb), C(hbm_total_mb), C(idle).
  returned: always
  type: list
  elements: dict
waited_s:
  description: Seconds waited until free, or until the deadline.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import npu_procs, npu_smi  # noqa: E402


def _check_inputs(module):
    p = module.params
    if p["wait_s"] < 0:
        module.fail_json(msg=f"wait_s {p['wait_s']} is negative; give the seconds to wait (0 looks once)")
    if p["poll_s"] <= 0:
        module.fail_json(msg=f"poll_s {p['poll_s']} must be more than 0 seconds, e.g. 1")
    if not 0 <= p["idle_hbm_pct"] <= 100:
        module.fail_json(msg=f"idle_hbm_pct {p['idle_hbm_pct']} is not a percentage (0-100), e.g. 15")


def main():
    module = AnsibleModule(
        argument_spec={
            "wait_s": {"type": "int", "default": 30},
            "poll_s": {"type": "float", "default": 1},
            "engines_root": {"type": "path", "required": True},
            "idle_hbm_pct": {"type": "int", "default": 15},
            "npu_smi": {"type": "str", "default": "npu-smi"},
            "devices": {"type": "list", "elements": "int"},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    _check_inputs(module)
    p = module.params
    exe = npu_smi.find_npu_smi(p["npu_smi"])
    if exe is None:
        module.fail_json(msg=f"{npu_smi.not_found(p['npu_smi'])}: the NPUs cannot be checked. Run the driver stage "
                             "(playbooks/driver.yml) on this node, or set npu_smi to the tool's path.", free=False)

    def read_info():
        return npu_smi.read_info(lambda argv: module.run_command(argv, handle_exceptions=False), exe)

    try:
        result = npu_procs.wait_free(read_info, p["engines_root"], p["wait_s"], p["poll_s"], p["devices"],
                                     p["idle_hbm_pct"])
    except npu_procs.NpuFreeError as exc:
        module.fail_json(msg=str(exc), free=False)
    unreadable = result.pop("unreadable")
    if unreadable:
        module.warn(f"the open files of {len(unreadable)} process(es) could not be read (pids "
                    f"{', '.join(str(pid) for pid in unreadable[:10])}): run npu_free as root (become: true)")
    if not result["free"]:
        module.fail_json(msg=result.pop("message"), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
