"""Scaled dot-product attention as torch picks it on the target (memviz.predictor.rules.attention), against the
source (sdp_utils.cpp, flash_api.cpp) and an H200 recording."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import memviz  # noqa: E402


def _attention(gqa: bool) -> None:
    q = torch.randn(4, 16, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv_heads = 4 if gqa else 16
    k = torch.randn(4, kv_heads, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(4, kv_heads, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).float().sum().backward()


@pytest.mark.parametrize("gqa", [False, True])
def test_grouped_query_attention_runs_a_fused_kernel(gqa: bool) -> None:
    """With fewer key/value heads (``enable_gqa``) the fused kernels still run (sdp_utils.cpp:
    ``check_batch_size_and_num_heads_dense<supports_gqa=true>``): no (B, H, L, L) attention matrix is allocated;
    the backward's expanded dK / dV at the query's heads are (flash_api.cpp's mha_bwd)."""
    p = memviz.predict(_attention, gqa, device="H200")
    allocs = [e for e in p.events if e.action == "alloc"]
    assert not any(e.nbytes >= 4 * 16 * 256 * 256 * 2 for e in allocs)  # no attention matrix
    expanded = [e for e in allocs if e.category == "workspaces" and e.nbytes == 4 * 256 * 16 * 64 * 2
                and e.op.startswith("_scaled_dot_product_flash_attention_backward")]
    assert len(expanded) == (2 if gqa else 0)


def test_a_grouped_query_llama_step_as_recorded_on_the_h200() -> None:
    """hf-lora-llama1b-bf16-b8-s512 (fitted: the GQA rule was checked on it): peak reserved and allocated exact."""
    pytest.importorskip("peft")
    from evaluation import recorded

    run = recorded.load_set("hf")[0]
    row = recorded.compare_run(next(r for r in run if r["id"] == "hf-lora-llama1b-bf16-b8-s512"))
    assert row.predicted_fits and abs(row.reserved_error) <= 0.01 and abs(row.allocated_error) <= 0.01


def test_a_grouped_query_fp32_llama_step_runs_the_math_path_as_recorded_on_the_h200() -> None:
    """hf-llama400m-b4-s512 (fp32, 16 query and 4 key/value heads, no mask: ``enable_gqa``): flash takes no fp32
    and memory-efficient attention no grouped heads, so the math path runs; the prediction completes (a backward
    returning dK / dV at the query's heads would stop it) and its peaks are the H200's, within 1%."""
    from evaluation import recorded

    runs = recorded.load_set("hf")[0]
    row = recorded.compare_run(next(r for r in runs if r["id"] == "hf-llama400m-b4-s512"))
    assert row.predicted_fits and abs(row.reserved_error) <= 0.01 and abs(row.allocated_error) <= 0.01
