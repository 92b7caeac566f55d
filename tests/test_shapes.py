"""A tensor's request is numel × element size, with the arithmetic shown."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memviz.errors import SizeError
from memviz.shapes import DTYPE_SIZES, dtype_name, read_size, size_request, tensor_request


def test_seed_articles_big_tensor_is_128_gib_not_half_a_gigabyte():
    request = tensor_request((2048, 4096, 4096), "float32")
    assert request.nbytes == 128 << 30
    assert request.arithmetic == "2048 × 4096 × 4096 × 4 B (float32) = 137,438,953,472 B = 128.00 GiB"


def test_small_tensor_of_the_demo():
    request = tensor_request((100, 100))
    assert (request.nbytes, request.dtype, request.numel) == (40_000, "float32", 10_000)


@pytest.mark.parametrize(("dtype", "name"), [("half", "float16"), ("bf16", "bfloat16"), ("torch.int64", "int64"),
                                             ("double", "float64"), ("uint8", "uint8")])  # fmt: skip
def test_dtype_aliases(dtype, name):
    assert dtype_name(dtype) == name


def test_torch_dtype_is_accepted():
    torch = pytest.importorskip("torch")
    assert tensor_request((3,), torch.bfloat16).nbytes == 6
    for name in DTYPE_SIZES:
        assert getattr(torch, name).itemsize == DTYPE_SIZES[name]


@pytest.mark.parametrize(
    ("shape", "dtype", "words"),
    [((0, 3), "float32", "positive"), ((-1,), "float32", "positive"), ((2.5,), "float32", "non-integer"),
     ((), "float32", "non-empty"), ("3x3", "float32", "non-empty"), ((3,), "float33", "unknown dtype"),
     ((2**40, 2**40), "float64", "int64"), ((True,), "float32", "non-integer")],
)  # fmt: skip
def test_bad_shapes_and_dtypes(shape, dtype, words):
    with pytest.raises(ValueError, match=words):
        tensor_request(shape, dtype)


def test_size_request_is_uint8_bytes():
    request = size_request("512 MiB")
    assert (request.nbytes, request.shape, request.dtype) == (512 << 20, (512 << 20,), "uint8")
    assert request.arithmetic == "536,870,912 B = 512.00 MiB"


@pytest.mark.parametrize(
    ("text", "value"),
    [("(2048, 4096)", (2048, 4096)), (" [8] ", (8,)), ("(7,)", (7,)), ("100x100", (100, 100)),
     ("2048 × 4096 × 4", (2048, 4096, 4)), ("3*3", (3, 3)), ("(1_000, 2)", (1000, 2)),
     ("1,024", 1024), ("1,000", 1000), ("512 MiB", 512 << 20), ("40000", 40000)],
)  # fmt: skip
def test_read_size_tells_shapes_from_bytes(text, value):
    assert read_size(text) == value


@pytest.mark.parametrize(
    ("bad", "words"),
    [("(1024, 1024", r"unclosed '\('"), ("[1, 2)", r"unclosed '\['"), ("1024, 1024)", "unmatched bracket"),
     ("(1,024)", "without a leading zero"), ("(1, two)", "'two' is not a dimension"), ("()", "empty"),
     ("(0, 3)", "positive"), ("(-1, 2)", "'-1'"), ("(1,,2)", "dimension"), ("7,", "groups of three"),
     ("(١, 2)", "dimension"), (12, "must be a str")],
)  # fmt: skip
def test_read_size_refuses_with_the_rule(bad, words):
    with pytest.raises(SizeError, match=words):
        read_size(bad)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=4))
def test_shapes_read_back_in_every_spelling(dims):
    assert read_size(str(tuple(dims))) == read_size(str(list(dims))) == tuple(dims)
    if len(dims) > 1:
        assert read_size(" x ".join(map(str, dims))) == read_size("×".join(map(str, dims))) == tuple(dims)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789,()[]x _.KiMGB", max_size=16))
def test_any_typed_size_is_a_shape_bytes_or_a_size_error(text):
    try:
        value = read_size(text)
    except SizeError:
        return
    assert isinstance(value, int) or all(isinstance(d, int) and d > 0 for d in value)
