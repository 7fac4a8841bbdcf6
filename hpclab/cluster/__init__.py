"""cluster: starting, watching and stopping MPI engines — the Lab, launch plans and profiles,
the host and Slurm, the world check, the reaper and watchdog, the client-side Run handle.

Imports `hpclab.core` and `hpclab.records`; names functions of `hpclab.rank` only to send them
to the engines (never runs them here).
"""
