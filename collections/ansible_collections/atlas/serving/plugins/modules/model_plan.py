#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_plan
short_description: NPU memory plan of a serving profile for a model on this host
description:
  - Reads the model's C(config.json) and the headers of its C(*.safetensors) files (8-byte length +
    JSON; no tensor data) from O(model_dir), takes the parallel layout (tensor, pipeline and data
    parallel size, expert parallel), the weight scheme (dtype, W8A8 from C(--quantization)), max model
    length, concurrency and memory utilisation from the profile's O(flags), and computes per NPU the
    weights, the KV cache bytes per token (MLA's latent cache for DeepSeek-style models), how many
    sequences of max model length fit and the headroom, over O(nodes) x O(npu_count) NPUs.
  - Fails, with the numbers and the nearest fix (more nodes, more NPUs, lower max length, 8-bit
    weights), when the plan cannot fit. Read-only; check mode supported; never changed.
version_added: 0.1.0
options:
  model_dir:
    description: Model directory on the host (the bundle's C(models/<model>) or the staged copy).
    type: path
    required: true
  model_config:
    description: C(config.json) content to use when O(model_dir) has none (weights then come from the
      architecture's parameter count x dtype).
    type: dict
  engine:
    description: Engine family of the profile.
    type: str
    required: true
    choices: [vllm, sglang]
  flags:
    description: The profile's flag dict; only the planning flags are read (tensor, pipeline and data
      parallel size, expert parallel, quantization, node count, dtype, max model length, max sequences,
      memory utilisation, by the engine's names).
    type: dict
    required: true
  npu_count:
    description: NPUs in each host of the instance.
    type: int
    required: true
  nodes:
    description: Hosts of the instance (default from the flags, C(--nnodes) or the data parallel size over
      the local data parallel size, else 1).
    type: int
  hbm_mb:
    description: HBM per NPU in MB as npu-smi prints it.
    type: int
    required: true
  reserve_gib:
    description: Activation/workspace reserve per NPU in GiB.
    type: float
    default: 2.0
  name:
    description: Name used in messages (the profile).
    type: str
    default: profile
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Plan the profile against the bundle's model
  atlas.serving.model_plan:
    model_dir: /srv/atlas-bundle/models/llama-2-70b-chat-hf
    engine: vllm
    flags: {--tensor-parallel-size: 8, --dtype: float16, --max-model-len: 2048, --max-num-seqs: 10}
    npu_count: 8
    hbm_mb: 65536
"""

RETURN = r"""
plan:
  description: The plan (byte figures are integers; fits, full_concurrency, fixes and message when refused).
  returned: always
  type: dict
"""

import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import memplan  # noqa: E402

_PLAN_FLAGS = ("--tensor-parallel-size", "--tp-size", "--dtype", "--max-model-len", "--context-length",
               "--max-num-seqs", "--max-running-requests", "--gpu-memory-utilization", "--mem-fraction-static",
               "--pipeline-parallel-size", "--pp-size", "--data-parallel-size", "--dp-size",
               "--data-parallel-size-local", "--enable-expert-parallel", "--ep-size", "--enable-dp-attention",
               "--nnodes", "--quantization")


def main():
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "model_config": {"type": "dict"},
            "engine": {"type": "str", "required": True, "choices": ["vllm", "sglang"]},
            "flags": {"type": "dict", "required": True},
            "npu_count": {"type": "int", "required": True},
            "nodes": {"type": "int"},
            "hbm_mb": {"type": "int", "required": True},
            "reserve_gib": {"type": "float", "default": 2.0},
            "name": {"type": "str", "default": "profile"},
        },
        supports_check_mode=True,
    )
    p = module.params
    config_path = os.path.join(p["model_dir"], "config.json")
    flags = {k: v for k, v in p["flags"].items() if k in _PLAN_FLAGS and v not in (None, "")}
    try:
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as fh:
                config = json.load(fh)
        elif p["model_config"]:
            config = p["model_config"]
        else:
            module.fail_json(msg=f"{config_path} does not exist and no model_config was given: stage the "
                             "model in the bundle or ship roles/serving/files/models/<model>/config.json")
        has_weights = any(n.endswith(".safetensors") for n in os.listdir(p["model_dir"])) if os.path.isdir(
            p["model_dir"]) else False
        weights = None
        if has_weights:  # less the layers past num_hidden_layers (DeepSeek's MTP layer, not loaded)
            found = memplan.safetensors_weight_bytes(p["model_dir"], memplan.model_shape(config)["layers"])
            weights = found["bytes"] - found["beyond_layers_bytes"]
        result = memplan.plan_model(config, p["engine"], flags, p["npu_count"], memplan.hbm_bytes_of(p["hbm_mb"]),
                                    weights, memplan.gib_bytes(p["reserve_gib"], "reserve_gib"), p["name"],
                                    nodes=p["nodes"])
    except (memplan.PlanError, OSError, ValueError) as exc:
        module.fail_json(msg=f"{p['name']}: cannot plan: {exc}")
    if not result["fits"]:
        module.fail_json(msg=result["message"], plan=result)
    module.exit_json(changed=False, plan=result)


if __name__ == "__main__":
    main()
