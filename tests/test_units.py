"""Sizes typed by a learner become exact bytes, or a clear error."""

import math

import pytest

from memviz.units import MAX_BYTES, SizeError, format_bytes, format_size, parse_size


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
