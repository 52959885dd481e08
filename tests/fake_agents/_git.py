"""Shared by the git-misbehaving fake agents: run git in the workspace like an agent would."""

import subprocess


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()
