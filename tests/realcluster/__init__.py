"""The real MLBatch control plane, built from pinned Go modules and started on loopback.

`python -m tests.realcluster build|up|down|env` by hand; the `realcluster` pytest fixture
in tests.
"""
