"""Torch functions whose CUDA memory the predictor does not model: the note a prediction gets when a program
calls one on device tensors (by the function's ``__name__``)."""

from __future__ import annotations

from . import Rule

__all__ = ["RULES"]

RULES = (
    Rule("cuDNN RNNs", "unmodelled", "unmodelled", ("lstm", "gru", "rnn_tanh", "rnn_relu"), None, "source",
         "aten/src/ATen/native/cudnn/RNN.cpp",
         doc="recurrent layers: cuDNN's packed weights, workspace and reserve space are not modelled (the "
             "cell-by-cell composite is predicted instead)"),
    Rule("transposed convolutions", "unmodelled", "unmodelled", ("conv_transpose2d",), None, "source",
         "aten/src/ATen/native/cudnn/Conv_v8.cpp", doc="transposed convolutions: cuDNN's workspace is not modelled"),
)
