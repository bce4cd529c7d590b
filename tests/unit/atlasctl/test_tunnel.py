"""The SSH tunnel of the rollout's SLO bench (atlasctl.tunnel): the inventory's SSH settings, strict host keys,
a local forward to the engine as the node sees it; a node that cannot be reached is one clear error."""

from __future__ import annotations

import pytest

from atlasctl import inventory, tunnel
from atlasctl.errors import EnvironmentProblem


def _target(**extra):
    hv = {"ansible_host": "10.0.0.11", "ansible_user": "root", "ansible_ssh_private_key_file": "/k",
          "ansible_ssh_common_args": "-o UserKnownHostsFile=/kh -o ProxyJump=root@10.0.0.2", **extra}
    return inventory.target("n1", hv)


def test_the_forward_uses_the_inventory_s_ssh_settings():
    argv = tunnel.argv(_target(), "10.0.0.11", 8000, 40001)
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert "ProxyJump=root@10.0.0.2" in argv and "UserKnownHostsFile=/kh" in argv and "/k" in argv
    assert argv[-3:] == ["-L", "127.0.0.1:40001:10.0.0.11:8000", "root@10.0.0.11"]
    assert "ExitOnForwardFailure=yes" in argv and "-N" in argv
    assert tunnel.argv(_target(), "fd00::11", 8000, 40001)[-2] == "127.0.0.1:40001:[fd00::11]:8000"


def test_a_node_that_cannot_be_reached_is_one_clear_error():
    target = _target(ansible_host="127.0.0.1", ansible_port=1,
                     ansible_ssh_common_args="-o UserKnownHostsFile=/dev/null")
    with pytest.raises(EnvironmentProblem, match="n1: no SSH tunnel to 127.0.0.1:8000") as caught:
        with tunnel.tunnel(target, "127.0.0.1", 8000, timeout_s=10):
            pass
    assert "ansible n1 -m ping" in caught.value.fix
