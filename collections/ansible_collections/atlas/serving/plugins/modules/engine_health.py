#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_health
short_description: Health probe of a serving node in one call (record, unit, /health, /v1/models, a completion, NPUs)
version_added: "0.1.0"
description:
  - Reads the service record the serving stage wrote, requires the systemd unit to be active, waits
    on the node for C(/health) to answer 200, requires C(/v1/models) to list the served model name and
    one completion to come back with text and C(usage.completion_tokens) of at least 1, then reads the
    NPU state (as M(atlas.serving.npu_facts)).
  - One round trip to the node where the tasks it replaces made six, and the wait for C(/health)
    polls on the node, not from the controller. A unit that fails or stops during the wait ends it at
    once, naming the unit's state.
  - The completion must finish within O(completion_deadline_s). One that does not is judged by two
    C(/metrics) samples O(hang_window_s) apart, its request still open (it counts as work present);
    the module fails with C(engine hung at ...) when work was present and no progress counter moved
    (generated tokens, finished requests, the time-to-first-token and inter-token-latency histogram
    counts, summed; vLLM's C(/health) stays 200 through a hung collective), with C(engine slow at ...)
    when they moved (overloaded, not hung), or with C(engine no-metrics at ...) when the engine exports
    none (SGLang needs C(--enable-metrics)). The message carries the evidence, the instance and the fix;
    the result's C(progress) the verdict.
  - A completion back in time costs one C(/metrics) sample, not the window; O(hang_check=true) samples
    the window while the completion runs and fails on a C(hung) verdict.
  - On a non-head rank of a multi-node instance (its record's C(instance.entry) is false) only the
    record and the unit are checked; C(/health), C(/v1/models) and the completion are the head's
    (C(headless=true) in the result).
  - Read-only. In check mode a node without a service record (a bare node) is not an error - the
    result has C(record=null); outside check mode it fails, naming the stage to run.
options:
  service:
    description: The systemd unit.
    type: str
    default: atlas-serving
  record:
    description: The service record (JSON) the serving stage wrote.
    type: path
    required: true
  url:
    description:
      - Base URL as seen from the node; empty for the address and port its service record names (loopback
        for an engine listening on every address).
    type: str
  served_model_name:
    description: Name C(/v1/models) must list; empty for the recorded one.
    type: str
  api_key:
    description: Bearer key the engine requires; empty for none. Never returned or logged.
    type: str
    default: ""
  timeout_s:
    description: Seconds to wait for C(/health) to answer 200.
    type: float
    default: 600
  poll_s:
    description: Seconds between polls of C(/health).
    type: float
    default: 5
  prompt:
    description: Prompt of the one completion.
    type: str
    default: Hello
  max_tokens:
    description: C(max_tokens) of the completion.
    type: int
    default: 8
  completion_deadline_s:
    description: Seconds the completion has to finish; more is C(slow) or C(hung) (see O(hang_window_s)).
    type: float
    default: 30
  hang_window_s:
    description:
      - Seconds between the two C(/metrics) samples that tell C(hung) from C(slow) when the completion misses
        its deadline. C(0) turns the hang check off (a missed deadline fails without a verdict).
    type: float
    default: 10
  hang_check:
    description:
      - Sample the window while the completion runs even when it finishes in time, and fail on C(hung).
        Adds O(hang_window_s) to a healthy probe. Needs O(hang_window_s) above 0.
    type: bool
    default: false
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.npu_smi
"""

EXAMPLES = r"""
- name: Health of the engine after a restart
  atlas.serving.engine_health:
    record: /etc/atlas/serving/atlas-serving.json
    timeout_s: 300
    poll_s: 1
  register: health_probe

- name: Health with the hang check forced (two /metrics samples 10 s apart while the completion runs)
  atlas.serving.engine_health:
    record: /etc/atlas/serving/atlas-serving.json
    completion_deadline_s: 30
    hang_window_s: 10
    hang_check: true
"""

RETURN = r"""
record:
  description: The service record (null in check mode on a node without one).
  returned: always
  type: dict
url:
  description: Base URL probed.
  returned: when the record exists
  type: str
unit:
  description: C(ActiveState) and C(SubState) of the unit.
  returned: when the record exists
  type: dict
health:
  description: Status of C(/health) (200).
  returned: when the record exists
  type: int
waited_s:
  description: Seconds until C(/health) answered 200.
  returned: when the record exists
  type: float
completion_tokens:
  description: C(usage.completion_tokens) of the completion (null on a headless rank).
  returned: when the record exists
  type: int
progress:
  description:
    - The hang check (null on a headless rank); also in the failed result of C(engine hung|slow|no-metrics).
    - C(verdict) one of C(ok), C(idle), C(slow), C(hung), C(no-metrics); C(reason) in words; C(evidence)
      with C(engine), C(window_s), C(before) and C(after) (each C(status), C(error), C(engine), C(work) and
      C(progress) values by metric name; C(before) null when one sample was taken), C(delta) per progress
      counter, and C(completion) (C(status), C(seconds), C(error), C(deadline_s)).
  returned: when the record exists
  type: dict
  sample:
    verdict: ok
    reason: the completion finished in 0.4 s
    evidence:
      engine: vllm
      window_s: 0.0
      before: null
      after: {status: 200, error: null, engine: vllm, work: {"vllm:num_requests_running": 0.0},
              progress: {"vllm:generation_tokens_total": 8.0}}
      delta: {}
      completion: {status: 200, seconds: 0.4, error: null, deadline_s: 30.0}
headless:
  description: True on a non-head rank of a multi-node instance (no HTTP probed).
  returned: on a headless rank
  type: bool
instance:
  description: The record's C(instance) (name, nodes, rank, head, role, entry, mode).
  returned: on a headless rank
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.health import (  # noqa: E402
    ProbeError,
    parse_show,
    probe,
    read_record,
)
from ansible_collections.atlas.serving.plugins.module_utils.npu_smi import gather  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "service": {"type": "str", "default": "atlas-serving"},
            "record": {"type": "path", "required": True},
            "url": {"type": "str"},
            "served_model_name": {"type": "str"},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "timeout_s": {"type": "float", "default": 600},
            "poll_s": {"type": "float", "default": 5},
            "prompt": {"type": "str", "default": "Hello"},
            "max_tokens": {"type": "int", "default": 8, "no_log": False},  # a count of tokens, not a secret
            "completion_deadline_s": {"type": "float", "default": 30},
            "hang_window_s": {"type": "float", "default": 10},
            "hang_check": {"type": "bool", "default": False},
            "npu_smi_path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    p = module.params
    try:
        record = read_record(p["record"])
    except ProbeError as exc:
        module.fail_json(msg=str(exc))
    if record is None:
        if module.check_mode:
            module.exit_json(changed=False, record=None)
        module.fail_json(msg=f"{p['record']} does not exist: the serving stage has not run on this node. "
                             "Run site.yml (or playbooks/serving.yml) first.")

    def unit_state():
        rc, out, err = module.run_command(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--",
                                           p["service"]])
        if rc != 0:
            return {"ActiveState": "unknown", "SubState": (err or out).strip()}
        return parse_show(out)

    try:
        result = probe(record, p["url"], p["served_model_name"], p["service"], unit_state, p["api_key"],
                       p["timeout_s"], p["poll_s"], p["prompt"], p["max_tokens"],
                       completion_deadline_s=p["completion_deadline_s"], hang_window_s=p["hang_window_s"],
                       hang_check=p["hang_check"])
    except ProbeError as exc:
        module.fail_json(msg=str(exc), record=record, progress=getattr(exc, "progress", None))
    # The NPU table only (count, health, HBM for the health report): no board (one npu-smi call per NPU).
    npu = gather(lambda argv: module.run_command(argv, handle_exceptions=False), p["npu_smi_path"],
                 read_boards=False)
    module.exit_json(changed=False, record=record, ansible_facts={"npu": npu}, **result)


if __name__ == "__main__":
    main()
