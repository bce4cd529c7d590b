"""A release's speculative decoding method against its wheel set's requirements.lock (module_utils/speculative.py,
the speculative_problem filter, the engines role's install): vLLM's method "suffix" with no arctic-inference in the
lock is refused naming the node, the set, the method, the package and the fix; anything else passes."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter.engines import FilterModule
from ansible_collections.atlas.serving.plugins.module_utils import speculative

ROOT = Path(__file__).resolve().parents[3]
LOCK_WITHOUT = "torch==2.10.0\ntorch-npu==2.10.0.post4\nvllm==0.23.0+empty\nvllm-ascend==0.23.0\n"
LOCK_WITH = LOCK_WITHOUT + "arctic-inference==0.1.1\n"
SUFFIX = {"--speculative-config": '{"method": "suffix", "num_speculative_tokens": 8}'}
MTP = {"--speculative-config": '{"num_speculative_tokens": 3, "method": "mtp"}'}
speculative_problem = FilterModule().filters()["speculative_problem"]


def slurped(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_suffix_without_arctic_inference_is_refused_naming_node_set_method_package_and_fix():
    problem = speculative_problem(SUFFIX, slurped(LOCK_WITHOUT), "bank-a1", "vllm-ascend-0.23.0")
    for part in ("bank-a1", "vllm-ascend-0.23.0", "'suffix'", "arctic-inference", "refused before installing",
                 "another speculative method", "vllm-ascend-0.23.0.post1", "Huawei's Ascend mirror"):
        assert part in problem, part


@pytest.mark.parametrize("value", [{"method": "suffix"}, '{"method":"suffix"}'])
def test_suffix_as_a_mapping_or_compact_json_is_refused(value):
    assert "arctic-inference" in speculative.speculative_problem({"--speculative-config": value}, LOCK_WITHOUT,
                                                                 "n", "s")


@pytest.mark.parametrize("lock", [LOCK_WITH,
                                  LOCK_WITHOUT + "Arctic_Inference==0.1.1 ; platform_machine == 'aarch64'\n"])
def test_suffix_with_arctic_inference_in_the_lock_passes(lock):
    assert speculative_problem(SUFFIX, slurped(lock), "n", "s") == ""


def test_a_commented_out_pin_does_not_count():
    assert speculative.speculative_problem(SUFFIX, LOCK_WITHOUT + "# arctic-inference==0.1.1\n", "n", "s")


@pytest.mark.parametrize("flags", [
    MTP,                                                  # mtp needs no package
    {"--speculative-config": '{"method": "ngram", "num_speculative_tokens": 4}'},
    {"--max-model-len": 4096},                            # no speculative config
    {},
    None,
    {"--speculative-config": False},                      # removed by serving_flags_extra
    {"--speculative-config": '{"method": "suffix"'},      # not JSON: the engine's lint names it
    {"--speculative-config": "suffix"},
    {"--speculative-config": '["suffix"]'},
    {"--speculative-config": '{"num_speculative_tokens": 3}'},
])
def test_anything_but_a_method_needing_a_missing_package_passes(flags):
    assert speculative_problem(flags, slurped(LOCK_WITHOUT), "n", "s") == ""


def test_the_table_names_vllms_suffix_package():
    assert speculative.METHOD_PACKAGES["suffix"] == "arctic-inference"


def test_bad_input_is_an_error():
    with pytest.raises(AnsibleFilterError, match="not base64"):
        speculative_problem(SUFFIX, "not base64!", "n", "s")
    with pytest.raises(AnsibleFilterError, match="dict of engine flags"):
        speculative_problem(["--speculative-config"], slurped(LOCK_WITH), "n", "s")


def test_the_engines_role_asserts_it_before_the_install_block():
    tasks = yaml.safe_load((ROOT / "roles/engines/tasks/install.yml").read_text())
    names = [t["name"] for t in tasks]
    check = next(i for i, t in enumerate(tasks) if "atlas.serving.speculative_problem" in str(t.get("vars")))
    assert tasks[check]["ansible.builtin.assert"]["fail_msg"] == "{{ __engines_speculative_problem }}"
    lock = next(i for i, t in enumerate(tasks) if "ansible.builtin.slurp" in t and "requirements.lock" in str(t))
    install = next(i for i, t in enumerate(tasks) if "block" in t)
    assert lock < check < install, names
    assert "serving_profile_resolved is defined" in tasks[lock]["when"]
