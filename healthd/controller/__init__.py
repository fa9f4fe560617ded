"""`healthd controller`: the cluster-level half of healthd.

It watches node health through in-memory caches fed by list+watch, resets the
AppWrappers that run on EVICT nodes, and keeps each slack ClusterQueue's
`lendingLimit` equal to the capacity that is really there. One module per
activity; `controller.py` starts them under a Lease-held leadership.
"""
