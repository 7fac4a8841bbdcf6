"""records: what a run leaves on disk — the run store, strict JSON, where data and runs live,
CSV export, sweeps of many runs.

Imports only `hpclab.core`.
"""
