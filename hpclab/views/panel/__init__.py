"""views.panel: the ipywidgets side — the control panel and the live dashboard widget."""
