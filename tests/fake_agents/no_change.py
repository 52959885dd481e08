#!/usr/bin/env python3
"""Reads the prompt, thinks, changes nothing."""

import sys

sys.stdin.read()
print("fake agent: I have no idea what to change")
