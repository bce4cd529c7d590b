"""The atlas-serving lab stand-in behind ``python -m sglang.launch_server`` (python3 standard library only).

Settings of the stand-in itself: see :mod:`sglang._atlas_standin.knobs` (``ATLAS_STANDIN_*``).
"""
