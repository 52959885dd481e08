"""The settings, declared once (default, checks, help, section) and read from a config file
and the flags, and the table of known agent CLIs they are checked against.

Imports only the core layer.
"""
