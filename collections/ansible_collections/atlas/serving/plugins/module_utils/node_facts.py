# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What preflight reads from a node besides its NPUs and Ascend stack: free space per path and
whether files are readable. Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os

GIB = 2**30


def free_gib(paths):
    """{path: free GiB for an unprivileged user (df's "avail": f_bavail * f_frsize)}, and
    {path: why not} for the paths that cannot be measured. statvfs, as df uses: overlay and bind
    roots (containers, some appliances) are measured like any other mount."""
    free, errors = {}, {}
    for path in paths:
        try:
            st = os.statvfs(path)
        except FileNotFoundError:
            errors[path] = f"{path} does not exist on the node"
            continue
        except OSError as exc:
            errors[path] = f"{path}: cannot measure free space: {exc.strerror}"
            continue
        free[path] = round(st.f_bavail * st.f_frsize / GIB, 2)
    return free, errors


def free_gib_where(path):
    """Free GiB of the filesystem that holds ``path`` or will hold it (its nearest existing directory: an
    install path not made yet), and that directory; (None, why) when even ``/`` cannot be measured."""
    where = os.path.abspath(path)
    while not os.path.isdir(where) and where != os.path.dirname(where):
        where = os.path.dirname(where)
    free, errors = free_gib([where])
    return (free[where], where) if where in free else (None, errors[where])


def readable(paths):
    """{path: True when it is a regular file this process can read}."""
    return {path: os.path.isfile(path) and os.access(path, os.R_OK) for path in paths}


def exist(paths):
    """{path: True when it exists (a file, a directory, a device node; links followed)}."""
    return {path: os.path.exists(path) for path in paths}
