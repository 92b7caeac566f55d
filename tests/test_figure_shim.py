"""memviz's Figure loads plotly's front end through a small shim (memviz/widgets/figure.py): what the shim must
know about plotly's widget, checked against the installed plotly."""

import re

import plotly
import plotly.graph_objects as go

from memviz.widgets.figure import PLOTLY_ESM_PATH, SHIM_ESM, Figure


def test_the_shim_queues_every_python_to_browser_message_plotly_sends():
    queued = set(re.findall(r'"(_py2js_\w+)"', SHIM_ESM))
    sent = {name for name in go.FigureWidget.class_trait_names() if name.startswith("_py2js_")}
    assert queued == sent  # a message type the shim does not queue would be lost while plotly's module loads


def test_a_figure_ships_the_shim_and_plotly_s_own_module():
    fig = Figure()
    assert fig._esm.startswith("\n// memviz Figure") and len(fig._esm) < 5000
    assert repr(plotly.__version__) in fig._esm  # the page caches plotly's module per plotly version
    assert fig._plotly_esm == PLOTLY_ESM_PATH.read_text(encoding="utf-8")
    assert re.search(r"export\{[^}]* as default\}", fig._plotly_esm)  # the shim calls module.default()
