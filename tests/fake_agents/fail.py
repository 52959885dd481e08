#!/usr/bin/env python3
"""Fails the way a misconfigured agent does: a message on stderr, exit code 3."""

import sys

print("error: no API key configured", file=sys.stderr)
sys.exit(3)
