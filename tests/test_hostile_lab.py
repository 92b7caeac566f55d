"""The lab under hostile input and at scale (issue 16): one reading of sizes in the API and the dashboard,
bad arguments refused with the rule and nothing changed."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memviz.devices import SimulatedDevice
from memviz.errors import SizeError
from memviz.lab import Lab
from memviz.widgets.controls import Controls, parse_size_field


@pytest.fixture
def lab():
    return Lab("sim", device="T4", cap="2 GiB")


def state(lab):
    """Everything a refused call must leave as it was."""
    return (dict(lab.stats()), list(lab.events), dict(lab.tensors), lab.groups, list(lab.ops),
            lab.segments(), lab.describe())


@pytest.mark.parametrize(
    ("typed", "nbytes", "shape"),
    [("1,024", 1024, (1024,)), ("1,000", 1000, (1000,)), ("1,000 MiB", 1000 << 20, ((1000 << 20),)),
     ("(1, 24)", 96, (1, 24)), ("1x24", 96, (1, 24)), ("[8]", 32, (8,)), ("(7,)", 28, (7,))],
)  # fmt: skip
def test_lab_and_dashboard_read_a_typed_size_the_same_way(lab, typed, nbytes, shape):
    event = lab.allocate(typed, name="api")
    controls = Controls(lab)
    controls.size.value, controls.name.value = typed, "box"
    controls.buttons["Allocate"].click()
    assert controls.error == ""
    assert event.nbytes == lab.events[-1].nbytes == nbytes
    assert lab["api"].shape == lab["box"].shape == shape
    controls.close()


@pytest.mark.parametrize("typed", ["(1024, 1024", "1024, 1024)", "(1,024)", "1,00", "7,", "(1, two)", "()"])
def test_lab_and_dashboard_refuse_the_same_typed_sizes_and_change_nothing(lab, typed):
    lab.allocate("1 MiB", name="a")
    before = state(lab)
    with pytest.raises(SizeError):
        lab.allocate(typed)
    with pytest.raises(SizeError):
        parse_size_field(typed)
    controls = Controls(lab)
    controls.size.value = typed
    controls.buttons["Allocate"].click()
    assert controls.error and state(lab) == before
    controls.close()


# -- bad arguments: refused with the rule, the lab unchanged ------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda lab: lab.free(3), TypeError, r"free\(\) takes tensor or group names \(str\), not int 3"),
        (lambda lab: lab.free(["a", None]), TypeError, "not NoneType None"),
        (lambda lab: lab.free(["a", "nope"]), KeyError, "no tensor or group named 'nope'"),
        (lambda lab: lab.segment_table("x"), TypeError, r"segment_table\(limit\) is how many segment layouts"),
        (lambda lab: lab.segment_table(0), ValueError, "an int >= 1 such as 12, not int 0"),
        (lambda lab: lab.segment_table(True), TypeError, "not bool True"),
        (lambda lab: lab[["a"]], TypeError, "a tensor's name is a str, not list"),
        (lambda lab: lab.observe(3), TypeError, r"observe\(label\) takes a str"),
        (lambda lab: lab.allocate("1 MiB", count=10**6 + 1), ValueError, "count must be an int from 1 to 1,000,000"),
        (lambda lab: lab.allocate("1 MiB", count=2.0), ValueError, "count must be an int"),
        (lambda lab: lab.allocate((2, 2), "float33"), ValueError, "unknown dtype"),
        (lambda lab: lab.allocate("1 MiB", name="a"), ValueError, "already in the lab"),
    ],
)
def test_bad_calls_name_the_rule_and_change_nothing(lab, call, error, words):
    lab.allocate("1 MiB", name="a")
    lab.allocate(512, count=3, name="g")
    before = state(lab)
    with pytest.raises(error, match=words):
        call(lab)
    assert state(lab) == before


def test_free_takes_names_as_arguments_or_in_lists(lab):
    for name in ("a", "b", "c"):
        lab.allocate("1 MiB", name=name)
    lab.allocate(512, count=3, name="g")
    assert lab.free(["a", "b"]).names == ("a", "b")
    assert lab.free(("c",), "g").names == ("c", "g[0]", "g[1]", "g[2]")
    assert len(lab) == 0 and ["a"] not in lab


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"alloc_conf": 0}, TypeError, "alloc_conf must be a str in PYTORCH_CUDA_ALLOC_CONF syntax.*not int 0"),
        ({"alloc_conf": False}, TypeError, "not bool False"),
        ({"alloc_conf": []}, TypeError, r"not list \[\]"),
        ({"backend": 3}, ValueError, "backend must be one of"),
        ({"device": "1024 TiB"}, ValueError, "device='1024 TiB' has 1024.00 TiB; the simulator models devices of up"),
        ({"device": 2**62, "cap": 2**62 - 1}, ValueError, "an int is a device index: the simulator models a node of "
         "8 GPUs.*pass a size with a unit"),
        ({"device": "T4", "cap": "17 GiB"}, ValueError, "cap=17.00 GiB .* is more than the device's 16.00 GiB"),
        ({"device": "T4", "cap": 1.5}, ValueError, "float"),
        ({"device": True}, ValueError, "not True"),
    ],
)
def test_lab_arguments_are_checked_at_the_boundary(kwargs, error, words):
    with pytest.raises(error, match=words):
        Lab(**{"backend": "sim", **kwargs})


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 44), st.data())
def test_a_cap_is_the_limit_in_force(total, data):
    cap = data.draw(st.integers(1, total))
    lab = Lab("sim", device=SimulatedDevice(f"{total} B GPU", total), cap=cap)  # an int device is an index
    limit = lab.backend.allocator.allowed_memory_bytes
    assert lab.backend.cap_bytes == cap
    assert limit == (None if cap == total else cap)


@pytest.mark.parametrize(("cap", "error", "words"), [("1 GiB", TypeError, "cap must be an int"),
                                                     (1.5, TypeError, "not float 1.5"), (0, ValueError, "between 1"),
                                                     (17 << 30, ValueError, "more than the device's 16.00 GiB")])
def test_set_cap_on_a_live_lab_checks_its_input_and_changes_nothing(lab, cap, error, words):
    lab.allocate("1 MiB", name="a")
    before = state(lab), lab.backend.cap_bytes, lab.backend.allocator.allowed_memory_bytes
    with pytest.raises(error, match=words):
        lab.backend.set_cap(cap)
    assert (state(lab), lab.backend.cap_bytes, lab.backend.allocator.allowed_memory_bytes) == before


_names = st.sampled_from(["a", "b", "g", "g[1]", "nope", ""])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_names, st.integers(), st.none(), st.lists(_names, max_size=3)), max_size=4))
def test_free_of_any_arguments_frees_exactly_them_or_changes_nothing(args):
    lab = Lab("sim", device="T4")
    lab.allocate("1 MiB", name="a")
    lab.allocate("2 MiB", name="b")
    lab.allocate(512, count=3, name="g")
    before = state(lab)
    try:
        event = lab.free(*args)
    except (KeyError, ValueError, TypeError):
        assert state(lab) == before
        return
    gone = set(event.names)
    assert all(n not in lab for n in gone) and len(lab) == 5 - len(gone)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789,()[]x _.KiMGB-", max_size=14))
def test_allocate_of_any_typed_size_allocates_or_changes_nothing(typed):
    lab = Lab("sim", device="T4", cap="1 GiB")
    lab.allocate("1 MiB", name="a")
    before = state(lab)
    try:
        event = lab.allocate(typed, name="typed")
    except ValueError:
        assert state(lab) == before
        return
    assert event.names == (("typed",) if event.ok else ())


def test_freeing_a_group_of_262144_tensors_is_linear():
    """Issue 16: Lab._drop's list.remove per name made freeing a group quadratic (200,000 tensors 2.8 s,
    524,288 17.6 s, several times their allocation); 262,144 keeps the suite short and still tells them apart."""
    lab = Lab("sim", device="H200")
    start = time.process_time()
    lab.allocate(512, count=262_144, name="g")
    allocate_s = time.process_time() - start
    start = time.process_time()
    event = lab.free("g")
    free_s = time.process_time() - start
    assert len(event.names) == 262_144 and len(lab) == 0 and not lab.groups
    assert lab.stats()["allocated_bytes.all.current"] == 0
    assert free_s < allocate_s, (free_s, allocate_s)  # measured: linear 0.6 of it; the quadratic code 1.6 times
