"""gpukeeper inside other frameworks: PyTorch's and CuPy's allocations on the pool."""
