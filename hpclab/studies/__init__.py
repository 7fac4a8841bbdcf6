"""studies: measurements that are not training runs — the allreduce size sweep, the I/O
probe, the silent-data-corruption Monte-Carlo — run on a Lab's engines.

Import `hpclab.core`, `hpclab.records` and `hpclab.cluster`; run functions of
`hpclab.rank.probes` on every rank through `lab.apply(fn, *args, **kwargs)` (results in rank
order, the lab's error path for a lost engine), never through `lab.client`.
"""
