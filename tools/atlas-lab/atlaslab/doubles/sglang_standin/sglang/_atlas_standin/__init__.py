"""The atlas-serving lab stand-in behind ``python -m sglang.launch_server`` (python3 standard library only).

Multi-node ranks (``--nnodes``, ``--node-rank``, ``--dist-init-addr``, ``--watchdog-timeout``): see
:mod:`sglang._atlas_standin.dist`. Settings of the stand-in itself: see :mod:`sglang._atlas_standin.knobs`
(``ATLAS_STANDIN_*``).
"""
