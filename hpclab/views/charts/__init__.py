"""views.charts: static plotly figures and tables from runs and records, and the HTML report.
No ipywidgets here."""
