"""Sizes typed by a learner become exact bytes, or a clear error."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memviz.errors import SizeError
from memviz.sim.constants import MiB as ALLOCATOR_MiB
from memviz.units import MAX_BYTES, GiB, KiB, MiB, TiB, format_bytes, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        (40_000, 40_000),
        ("512 MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("1.5 GiB", 3 << 29),
        ("2 gib", 2 << 30),
        ("4096", 4096),
        ("4096 B", 4096),
        ("1e3 KB", 1_000_000),
        ("0.5 KiB", 512),
        ("1_000 bytes", 1000),
        (" 7 TB ", 7 * 10**12),
    ],
)
def test_parse_size_gives_exact_bytes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (0, "positive"),
        (-5, "positive"),
        ("-1 MiB", "cannot read"),
        (1.5, "float"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        ("12 parsecs", "unknown unit"),
        ("0.3 B", "whole number"),
        ("MiB", "cannot read"),
        ("", "cannot read"),
        (True, "not True"),
        (None, "NoneType"),
        (MAX_BYTES + 1, "int64"),
    ],
)
def test_bad_sizes_say_what_is_wrong(bad, words):
    with pytest.raises(SizeError, match=words):
        parse_size(bad)


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(1024, "1024 bytes"), (1025, "1.00 KiB"), (1 << 20, "1024.00 KiB"), (20 << 20, "20.00 MiB"),
     (1 << 30, "1024.00 MiB"), (2048 << 30, "2048.00 GiB")],
)  # fmt: skip
def test_format_size_matches_torchs_oom_message(nbytes, text):
    assert format_size(nbytes) == text


def test_format_bytes_for_people():
    assert format_bytes(512) == "512 B"
    assert format_bytes(128 << 30) == "128.00 GiB"
    assert format_bytes(-(3 << 20)) == "-3.00 MiB"


@pytest.mark.parametrize(("text", "nbytes"), [("1,024", 1024), ("1,000", 1000), ("1,000 MiB", 1000 << 20),
                                              ("1,048,576 B", 1 << 20), ("2,500.5 KB", 2_500_500)])  # fmt: skip
def test_commas_separate_thousands(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    ("bad", "words"),
    [("1,00", "groups of three"), ("1,0000", "groups of three"), ("100, 100", r"e\.g\. \(100, 100\)"),
     ("1,000_000", "groups of three"), ("1__0", "cannot read"), ("1_", "cannot read"),
     ("١٠٠", "cannot read"), ("0.6_0 GB", "cannot read"), ("(1024, 1024", "cannot read")],
)  # fmt: skip
def test_bad_groupings_and_non_ascii_digits_are_refused(bad, words):
    with pytest.raises(SizeError, match=words):
        parse_size(bad)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_BYTES))
def test_grouped_digits_read_back(n):
    assert parse_size(f"{n:,}") == parse_size(f"{n:_}") == parse_size(str(n)) == n


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_any_text_is_bytes_or_a_size_error(text):
    try:
        n = parse_size(text)
    except SizeError:
        return
    assert isinstance(n, int) and 1 <= n <= MAX_BYTES


def test_unit_constants_are_the_parser_and_printer_scales():
    assert (KiB, MiB, GiB, TiB) == (2**10, 2**20, 2**30, 2**40) and MiB is ALLOCATOR_MiB
    for name, scale in (("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", TiB)):
        assert parse_size(f"3 {name}") == parse_size(f"3 {name.upper()}") == 3 * scale
        assert format_bytes(3 * scale) == f"3.00 {name}"
    with pytest.raises(SizeError, match=r"known units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB$"):
        parse_size("3 PiB")
