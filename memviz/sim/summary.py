"""``memory_summary()``: the 75-column table ``torch.cuda.memory_summary()`` prints."""

from __future__ import annotations

__all__ = ["memory_summary"]


def _format_size(sz: int, pref_sz: int) -> str:
    prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_sz < 768 * 1024:
            break
        prefix = new_prefix
        sz //= 1024
        pref_sz /= 1024
    return f"{sz:6d} {prefix}"


def _format_count(cnt: int, pref_cnt: int) -> str:
    prefixes = [" ", "K", "M"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_cnt < 750 * 1000:
            break
        prefix = new_prefix
        cnt //= 1000
        pref_cnt /= 1000
    return f"{cnt:7d} {prefix} "


def memory_summary(stats: dict[str, int], abbreviated: bool = False, device_name: str = "GPU 0") -> str:
    """Return the summary table for a ``memory_stats()`` dict, laid out as torch/cuda/memory.py does.

    Args:
        stats: a flat ``memory_stats()`` dict.
        abbreviated: leave out the large/small pool sub-rows (default: False).
        device_name: shown in the title, "GPU 0" style; torch prints the device index.
    """
    device = device_name.split()[-1] if device_name.split() else device_name
    metrics_to_display = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "GPU reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "GPU reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    lines = []
    lines.append("=" * 75)
    lines.append(" {_:16} PyTorch CUDA memory summary, device ID {device_id:<17d} ")
    lines.append("-" * 75)
    lines.append("  {_:9} CUDA OOMs: {num_ooms:<12d} | {_:6} cudaMalloc retries: {num_alloc_retries:<8d}  ")
    lines.append("=" * 75)
    lines.append("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")
    for metric_key, metric_name, formatter in metrics_to_display:
        lines.append("-" * 75)
        submetrics = [("all", metric_name)]
        if not abbreviated:
            submetrics.append(("large_pool", "      from large pool"))
            submetrics.append(("small_pool", "      from small pool"))
        current_prefval, peak_prefval, allocated_prefval, freed_prefval = None, None, None, None
        for submetric_key, submetric_name in submetrics:
            prefix = metric_key + "." + submetric_key + "."
            current = stats[prefix + "current"]
            peak = stats[prefix + "peak"]
            allocated = stats[prefix + "allocated"]
            freed = stats[prefix + "freed"]
            if current_prefval is None:
                current_prefval, peak_prefval = current, peak
                allocated_prefval, freed_prefval = allocated, freed
            lines.append(
                f" {submetric_name:<21} | {formatter(current, current_prefval)} | "
                f"{formatter(peak, peak_prefval)} | {formatter(allocated, allocated_prefval)} | "
                f"{formatter(freed, freed_prefval)} ")
    metrics_to_display = [
        ("oversize_allocations", "Oversize allocations", _format_count),
        ("oversize_segments", "Oversize GPU segments", _format_count),
    ]
    for metric_key, metric_name, formatter in metrics_to_display:
        lines.append("-" * 75)
        prefix = metric_key + "."
        current = stats[prefix + "current"]
        peak = stats[prefix + "peak"]
        allocated = stats[prefix + "allocated"]
        freed = stats[prefix + "freed"]
        lines.append(
            f" {metric_name:<21} | {formatter(current, current)} | {formatter(peak, peak)} | "
            f"{formatter(allocated, allocated)} | {formatter(freed, freed)} ")
    lines.append("=" * 75)
    fmt_dict = {"_": "", "device_id": int(device) if device.isdigit() else 0}
    for k, v in stats.items():
        fmt_dict[k.replace(".", "-")] = v
    fmt_dict["num_ooms"] = stats["num_ooms"]
    fmt_dict["num_alloc_retries"] = stats["num_alloc_retries"]
    return "|" + "|\n|".join(lines).format(**fmt_dict) + "|\n"
