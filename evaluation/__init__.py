"""How well memviz's predictor does against real GPUs: the programs, the recordings, the comparisons.

Not part of the installed package (a wheel ships ``memviz`` only): run from a source checkout's root, e.g.
``python -m evaluation.recorded``. See evaluation/README.md.
"""
