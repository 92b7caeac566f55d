"""compare_configs' table: format_table's layout (two-line headers, a rule), the runs' own numbers."""

from memviz import compare_configs


def churn(lab):
    lab.allocate("16 MiB", count=8, name="a")
    lab.free("a")
    lab.allocate("32 MiB", count=4, name="b")


def test_table_lays_out_each_run():
    table = compare_configs(churn, configs=("", "expandable_segments:True"))
    assert str(table).splitlines() == [
        "                                peak        peak                               stranded",
        "                           requested    reserved  OOMs  cudaMalloc  cudaFree        now",
        "---------------------------------------------------------------------------------------",
        "(default)                 128.00 MiB  256.00 MiB     0          12         0        0 B",
        "expandable_segments:True  128.00 MiB  140.00 MiB     0           7         0  12.00 MiB",
    ]
    expandable = table["expandable_segments:True"]
    assert (expandable.peak_reserved_bytes, expandable.device_allocs, expandable.stranded_bytes) == (
        140 << 20, 7, 12 << 20)


def test_labels_name_the_workload_and_config_when_both_vary():
    table = compare_configs({"churn": churn, "again": churn}, configs=("", "expandable_segments:True"))
    labels = [line.split("  ")[0] for line in str(table).splitlines()[3:]]
    assert labels == ["churn · (default)", "churn · expandable_segments:True", "again · (default)",
                      "again · expandable_segments:True"]  # fmt: skip
