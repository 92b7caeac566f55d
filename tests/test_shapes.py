"""A tensor's request is numel × element size, with the arithmetic shown."""

import pytest

from memviz.shapes import DTYPE_SIZES, dtype_name, size_request, tensor_request


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
