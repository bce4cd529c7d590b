"""`atlasctl drain -i INV NODE...`: take serving units out of their branch gateways for hardware maintenance
(playbooks/maintenance.yml). A node stands for its whole unit (every rank of a multi-node instance); a branch's
last healthy backend is never drained (the drain waits for another, then refuses, naming the branch); units go
one after the other.

Exit status: 0 every unit drained, 1 one was refused or unreachable (the report says why), 2 bad command line.
"""

from __future__ import annotations

import argparse

from atlasctl import maintenance


def register(sub: argparse._SubParsersAction) -> None:
    maintenance.add_command(sub, "drain", "down", "drain serving units at their branch gateways (maintenance)", __doc__)
