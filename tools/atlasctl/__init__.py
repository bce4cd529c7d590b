"""atlasctl: provisioning, rollout and diagnostics for LLM serving on Atlas fleets."""

__version__ = "0.1.0"
