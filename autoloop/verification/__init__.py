"""The morning verdict: `autoloop verify`'s plan and its runs (attempts of kind verify).

Imports every layer below it, the engine included.
"""
