"""Exit codes of atlasctl. Scripts may rely on them."""

OK = 0
FAILED = 1  # the operation ran and found a problem (verification mismatch, unhealthy fleet)
USAGE = 2  # bad command line or bad input file; nothing was changed
ENVIRONMENT = 3  # the machine cannot do this (not root, missing tool, lab down)
INTERRUPTED = 130
