"""rank.features: what a lesson adds to the synchronous step (straggler, batch skew, SDC,
model averaging and groups, stale gradients, augmentation). Runs on a rank; imports `hpclab.core`
and `hpclab.rank` only.
"""
