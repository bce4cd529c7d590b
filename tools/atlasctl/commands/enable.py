"""`atlasctl enable -i INV NODE...`: send traffic to drained serving units again after maintenance
(playbooks/maintenance.yml), each once its unit passes the health gate (service, /health, /v1/models, a
completion on its entry). A node stands for its whole unit (every rank of a multi-node instance).

Exit status: 0 every unit enabled, 1 one was refused or unreachable (the report says why), 2 bad command line.
"""

from __future__ import annotations

import argparse

from atlasctl import maintenance


def register(sub: argparse._SubParsersAction) -> None:
    maintenance.add_command(sub, "enable", "up", "enable drained serving units at their branch gateways", __doc__)
