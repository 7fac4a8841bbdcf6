"""rank.probes: one rank's side of the studies (allreduce sweep, dataset stores, SDC trials).
Runs on a rank; imports `hpclab.core` and `hpclab.rank` only.
"""
