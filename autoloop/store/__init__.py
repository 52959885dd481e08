"""The files under results/: the ledger (the truth) and results.tsv, state.json, the
questions asked of a ledger, the research digest, the person's notes, a stop request,
capped run logs, atomic writes.

Imports the core and config layers.
"""
