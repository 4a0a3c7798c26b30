"""The caching memory pool's Python face (``MemoryPool``) and the out-of-memory retry."""
