"""Who holds a device's memory: the memory reports, the per-device manager, device utilities and the FAISS helpers."""
