"""The base layer: errors, argument checks, device names, NVML, host memory, build facts, and text, HTML and plot output."""
