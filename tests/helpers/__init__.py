"""What the tests share besides fixtures: importable as `helpers.<module>` because pytest's default
"prepend" import mode puts tests/ (the folder of conftest.py and of every test module; it has no
__init__.py) first on sys.path, on each xdist worker as in a plain run.

git: real git repositories in temporary folders; loop: the CLI on a scripted train.py and the
invariants of its results; night: a night's repo and ledger built by hand; watch: a night to
watch and the dashboard as a subprocess.
"""
