"""Lab stand-in for SGLang 0.5.6 (atlas-serving): same launch command, flags, endpoints and metric names.

Not the real engine: it generates deterministic text without a model. See ``sglang._atlas_standin``.
"""

from sglang.version import __version__

__all__ = ["__version__"]
