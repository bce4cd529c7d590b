"""Doctor's hosts (their SSH settings: atlasctl.inventory, shared with bundle push); SSH through fabric.

Host key checking stays on: the known_hosts files the inventory names
(``-o UserKnownHostsFile=...`` in ``ansible_ssh_common_args``), else the user's, are loaded
into paramiko with ``RejectPolicy``: an unknown or changed host key refuses the host.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from atlasctl import inventory as shared
from atlasctl.errors import EnvironmentProblem

SERVING_GROUP = shared.SERVING_GROUP
# One source of SSH settings for doctor and bundle push (atlasctl.inventory).
Target = shared.Target
target = shared.target
targets_from_listing = shared.targets_from_listing
load = shared.targets


def fabric_run(t: Target, command: str, timeout: float = 90.0) -> str:
    """Run ``command`` (bash) on ``t`` with strict host keys; its stdout (stderr is merged by the script)."""
    from fabric import Connection
    from paramiko import RejectPolicy

    kwargs: dict[str, Any] = {"look_for_keys": t.key_file is None, "allow_agent": t.key_file is None,
                              "banner_timeout": 15, "auth_timeout": 15}
    if t.key_file:
        kwargs["key_filename"] = [str(Path(t.key_file).expanduser())]
    conn = Connection(t.address, user=t.user, port=t.port, connect_timeout=10, connect_kwargs=kwargs)
    loaded = 0
    for path in t.known_hosts:
        if Path(path).is_file():
            conn.client.load_host_keys(path)
            loaded += 1
    if not loaded:
        raise EnvironmentProblem(f"{t.name}: no known_hosts file among {', '.join(t.known_hosts)}",
                                 fix="pin the host keys (ssh-keyscan, checked out of band) in the file the "
                                     "inventory names with -o UserKnownHostsFile=")
    conn.client.set_missing_host_key_policy(RejectPolicy())
    try:
        result = conn.run("bash -c " + shlex.quote(command), hide=True, warn=True, in_stream=False,
                          timeout=timeout)
    finally:
        conn.close()
    return result.stdout
