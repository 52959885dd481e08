"""Where changes come from: the interface (a ProposalRequest in, a Proposal out), the coding
agent and its checks, the offline mutator, Optuna, a queue of patches, a portfolio sharing a
night among them; which one a night gets is ``choose.py``.

Imports the core, config, store, execution, repo and observe layers.
"""
