"""The autograd engine's gradient joins: in place on the GPU where it holds the last reference
(memviz.predictor.rules.autograd), although the predictor's dispatch mode makes the engine add out of place."""

from __future__ import annotations

import torch

import memviz
from memviz.predictor.rules import autograd as accumulate


def _backward_adds(program) -> list[tuple[str, int]]:
    p = memviz.predict(program, device="H200")
    return [(e.op, e.nbytes) for e in p.events
            if e.action == "alloc" and e.phase == "backward" and e.op.startswith("add")]


def test_the_probe_sees_a_last_reference() -> None:
    tensor_count, storage_count = accumulate.last_reference_counts()
    assert tensor_count >= 1 and storage_count >= 1


def test_a_residual_join_allocates_nothing() -> None:
    """Two uses of ``y`` (a residual connection) and of ``w``: each pair of gradients is added into the first."""
    def program() -> None:
        w = torch.randn(256, 256, device="cuda", requires_grad=True)
        x = torch.randn(64, 256, device="cuda", requires_grad=True)
        y = torch.relu(x @ w)
        torch.relu(torch.relu(y @ w) + y).sum().backward()

    assert _backward_adds(program) == []


def test_a_join_into_an_expanded_gradient_allocates() -> None:
    """``sum``'s gradient is an expanded (not dense) tensor: the engine adds out of place."""
    def program() -> None:
        x = torch.randn(64, 256, device="cuda", requires_grad=True)
        y = x * 1.0
        z = y + y * 2.0  # y's first gradient is the expanded ones of sum()
        z.sum().backward()

    assert _backward_adds(program) == [("add.Tensor", 64 * 256 * 4)]


def test_an_add_inside_one_backward_formula_is_left_alone() -> None:
    """``torch.add(a, b)`` in a custom backward is the program's own add: a new tensor, as on the GPU."""
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            doubled = grad * 2
            return torch.add(doubled, doubled * 3)

    def program() -> None:
        x = torch.randn(64, 256, device="cuda", requires_grad=True)
        Twice.apply(torch.relu(x)).sum().backward()

    assert ("add.Tensor", 64 * 256 * 4) in _backward_adds(program)


def test_linear_on_a_transposed_input_adds_its_bias_in_place() -> None:
    """``at::linear``'s unfused path (``matmul``, then the bias added in place) — out of place under a
    dispatch mode unless the predictor does it as the GPU does."""
    def program() -> None:
        w = torch.randn(512, 256, device="cuda", requires_grad=True)
        b = torch.randn(512, device="cuda", requires_grad=True)
        x = torch.randn(32, 64, 256, device="cuda").transpose(0, 1)  # not contiguous
        torch.nn.functional.linear(x, w, b).sum().backward()

    p = memviz.predict(program, device="H200")
    forward = [(e.op, e.nbytes) for e in p.events if e.action == "alloc" and e.phase != "backward"]
    assert ("mm.default", 64 * 32 * 512 * 4) in forward
    assert not any(op.startswith("add") for op, _ in forward), forward
