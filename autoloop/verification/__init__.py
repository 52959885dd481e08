"""The morning verdict: `autoloop verify`'s and `autoloop ladder`'s plans and their runs (attempts of kind verify).

Imports every layer below it, the engine included.
"""
