"""Views: everything that shows runs to a person. Reads runs, never talks to the engines.

Static charts (plotly only, no widgets, no threads), each layer importing only the ones above it:

* :mod:`~hpclab.views.charts.facts` — a Run, RunRecord or run folder → :class:`RunFacts`; column helpers.
* :mod:`~hpclab.views.charts.outcomes` — what one run achieved: accuracy, throughput, steps to target.
* :mod:`~hpclab.views.charts.skeleton` — the dashboard's six-panel grid, the colours, TraceSpec.
* :mod:`~hpclab.views.charts.split` — the time-split panel: stacks per rank and POP's efficiencies.
* :mod:`~hpclab.views.charts.traces` — one run → trace specs; the static dashboard figure.
* :mod:`~hpclab.views.charts.comparison` — ``compare(runs)``: table and overlaid curves.
* :mod:`~hpclab.views.charts.batch_charts` — accuracy and steps/time to target vs global batch.
* :mod:`~hpclab.views.charts.scaling_charts` — throughput and scaling efficiency vs workers.
* :mod:`~hpclab.views.charts.report` — one self-contained HTML file.

Widgets (ipywidgets, imported when built): :mod:`~hpclab.views.panel.live` (the threaded live
dashboard) and the control panel (:mod:`~hpclab.views.panel.panel`). Static modules never import them.
"""
