"""The base layer: errors, argument checks, device names, NVML, host memory, build facts, output."""
