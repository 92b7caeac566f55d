"""A CUDA build of torch on a machine without a GPU predicts as the CPU build does: nothing in a prediction calls
into the CUDA runtime. Here (the CPU build) every function of torch._C a CUDA build has for the runtime, cuDNN and
NCCL is replaced by one that fails the test if called, while ordinary programs are predicted (a plain AdamW step
touched the runtime through torch.optim's capture-health check before the shim answered it). The same check for
real: scripts/predict_digest.py on a CUDA build with the GPU hidden gives the CPU build's predictions, call for call
(2.9.1+cu128 and 2.14.1+cu130 here, torch 2.11 on the H200 with CUDA_VISIBLE_DEVICES="")."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import memviz  # noqa: E402
from memviz import examples  # noqa: E402

CUDA_RUNTIME = (
    "_cuda_allocationTraceback", "_cuda_annotateMemory", "_cuda_attach_out_of_memory_observer",
    "_cuda_beginAllocateCurrentStreamToPool", "_cuda_beginAllocateCurrentThreadToPool", "_cuda_beginAllocateToPool",
    "_cuda_canDeviceAccessPeer", "_cuda_changeCurrentAllocator", "_cuda_checkPoolLiveAllocations",
    "_cuda_clearCublasWorkspaces", "_cuda_cudaCachingAllocator_enable", "_cuda_cudaCachingAllocator_is_enabled",
    "_cuda_cudaCachingAllocator_raw_alloc", "_cuda_cudaCachingAllocator_raw_delete", "_cuda_cudaHostAllocator",
    "_cuda_customAllocator", "_cuda_emptyCache", "_cuda_endAllocateToPool", "_cuda_exchangeDevice",
    "_cuda_getAllocator", "_cuda_getAllocatorBackend", "_cuda_getArchFlags", "_cuda_getCheckpointState",
    "_cuda_getCompiledVersion", "_cuda_getCublasLtWorkspaceSize", "_cuda_getCublasWorkspaceSize",
    "_cuda_getCurrentBlasHandle", "_cuda_getCurrentRawStream", "_cuda_getCurrentSolverHandle",
    "_cuda_getCurrentStream", "_cuda_getDefaultStream", "_cuda_getDevice", "_cuda_getDeviceCount",
    "_cuda_getHipblasltVersion", "_cuda_getMemoryFraction", "_cuda_getMemoryMetadata",
    "_cuda_getStreamFromExternal", "_cuda_get_conv_benchmark_empty_cache", "_cuda_get_cudnn_benchmark_limit",
    "_cuda_get_sync_debug_mode", "_cuda_hasPrimaryContext", "_cuda_hostMemoryStats", "_cuda_init",
    "_cuda_ipc_collect", "_cuda_isCurrentStreamCapturing", "_cuda_isHistoryEnabled", "_cuda_isInBadFork",
    "_cuda_jiterator_compile_and_launch_kernel", "_cuda_maybeExchangeDevice", "_cuda_memoryMetadataSupported",
    "_cuda_memorySnapshot", "_cuda_memoryStats", "_cuda_record_memory_history",
    "_cuda_record_memory_history_legacy", "_cuda_record_untuned_enable", "_cuda_record_untuned_is_enabled",
    "_cuda_releasePool", "_cuda_resetAccumulatedHostMemoryStats", "_cuda_resetAccumulatedMemoryStats",
    "_cuda_resetCublasLtWorkspaceSize", "_cuda_resetCublasWorkspaceSize", "_cuda_resetPeakHostMemoryStats",
    "_cuda_resetPeakMemoryStats", "_cuda_setCheckpointPoolState", "_cuda_setCublasLtWorkspaceSize",
    "_cuda_setCublasWorkspaceSize", "_cuda_setDevice", "_cuda_setMemoryFraction", "_cuda_setMemoryMetadata",
    "_cuda_setStream", "_cuda_set_cudnn_benchmark_limit", "_cuda_set_sync_debug_mode", "_cuda_sleep",
    "_cuda_synchronize", "_cuda_tunableop_enable", "_cuda_tunableop_get_cublaslt_requested_algo_count",
    "_cuda_tunableop_get_filename", "_cuda_tunableop_get_max_tuning_duration",
    "_cuda_tunableop_get_max_tuning_iterations", "_cuda_tunableop_get_results",
    "_cuda_tunableop_get_rotating_buffer_size", "_cuda_tunableop_get_validators", "_cuda_tunableop_is_enabled",
    "_cuda_tunableop_read_file", "_cuda_tunableop_set_cublaslt_requested_algo_count",
    "_cuda_tunableop_set_filename", "_cuda_tunableop_set_max_tuning_duration",
    "_cuda_tunableop_set_max_tuning_iterations", "_cuda_tunableop_set_numerical_check_tolerances",
    "_cuda_tunableop_set_rotating_buffer_size", "_cuda_tunableop_tuning_enable",
    "_cuda_tunableop_tuning_is_enabled", "_cudnn_clear_dropout_state", "_cudnn_set_conv_benchmark_empty_cache",
    "_nccl_all_gather", "_nccl_all_reduce", "_nccl_broadcast", "_nccl_init_rank", "_nccl_reduce",
    "_nccl_reduce_scatter", "_nccl_unique_id", "_nccl_version", "_nccl_version_suffix",
)
"""The callables of torch._C named _cuda_*, _cudnn_*, _nccl_* in torch 2.14.1+cu130."""


@pytest.fixture
def runtime_tripwire(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch as a CUDA build sees itself (``torch.backends.cuda.is_built()``), its runtime a tripwire."""
    touched: list[str] = []
    monkeypatch.setattr(torch._C, "_has_cuda", True)
    modules = [m for name, m in list(sys.modules.items()) if name.startswith("torch.") and m is not None]
    for name in CUDA_RUNTIME:
        def tripwire(*args: object, _name: str = name, **kwargs: object) -> None:
            touched.append(_name)
            raise AssertionError(f"the prediction called the CUDA runtime: torch._C.{_name}")
        original = getattr(torch._C, name, None)
        monkeypatch.setattr(torch._C, name, tripwire, raising=False)
        for module in modules:  # torch.cuda's modules import some by name (`from torch._C import ...`)
            if original is not None and vars(module).get(name) is original:
                monkeypatch.setattr(module, name, tripwire)
    return touched


def test_an_adamw_step_and_a_checkpointed_amp_step_never_touch_the_runtime(runtime_tripwire: list[str]) -> None:
    assert memviz.predict(examples.mlp_training, device="H200", batch=64, steps=2).fits
    assert memviz.predict(examples.gpt_training, device="T4", batch=2, seq=128, checkpoint=True).fits
    assert runtime_tripwire == []


def test_a_transformers_fine_tuning_step_never_touches_the_runtime(runtime_tripwire: list[str]) -> None:
    pytest.importorskip("transformers")
    from evaluation.programs import hf

    assert memviz.predict(hf.PROGRAMS["gpt2_finetune"], device="H200", batch=2, seq=64, size="tiny",
                          precision="fp16").fits
    assert runtime_tripwire == []
