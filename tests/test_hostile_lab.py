"""The lab under hostile input and at scale (issue 16): one reading of sizes in the API and the dashboard,
bad arguments refused with the rule and nothing changed."""

from __future__ import annotations

import pytest

from memviz.lab import Lab
from memviz.units import SizeError
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
