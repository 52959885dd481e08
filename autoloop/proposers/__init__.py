"""Proposers: where the next change to the target comes from."""
