"""The package imports and says what it is."""

import memviz


def test_version_is_a_string():
    assert isinstance(memviz.__version__, str)
    assert memviz.__version__.count(".") == 2
