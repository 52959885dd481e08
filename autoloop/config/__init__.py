"""The settings, declared once (default, checks, help, section), and the table of known
agent CLIs they are checked against.

Imports only the core layer.
"""
