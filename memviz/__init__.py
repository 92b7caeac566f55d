"""memviz: watch PyTorch's CUDA caching allocator, on a real GPU or an exact simulator.

Parts, one module each:

- :mod:`memviz.sim` — a pure-Python replica of c10's CUDACachingAllocator (no torch needed).
"""

__version__ = "0.1.0"
