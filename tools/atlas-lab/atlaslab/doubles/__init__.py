"""What the lab puts on nodes or in its bundle (npu-smi simulator, stand-ins, builders)."""
