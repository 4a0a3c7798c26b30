"""A device's memory: who holds it (the reports), the per-device manager, device utilities, FAISS."""
