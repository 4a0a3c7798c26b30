"""A device's memory: who holds it (reports), the per-device manager, device utilities, FAISS."""
