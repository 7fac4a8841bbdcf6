"""studies: measurements that are not training runs — the allreduce size sweep, the I/O
probe, the silent-data-corruption Monte-Carlo — run on a Lab's engines.

Import `hpclab.core`, `hpclab.records` and `hpclab.cluster`; ship functions of
`hpclab.rank.probes` to the engines.
"""
