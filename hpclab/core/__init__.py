"""core: pure knowledge both sides share — knobs, the run config and its plan, the reference
math (LR rules, throughput, POP efficiencies, health), the catalogue and the wire names.

Imported by the client and by the ranks; imports no other room of hpclab and nothing heavier
than NumPy.
"""
