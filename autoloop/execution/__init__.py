"""Running things: process trees and their containment, one trial process (the runner),
the network namespace, the measurement's inputs (integrity), devices, free disk, and the
executors (local, Slurm).

Imports the core, config and store layers.
"""
