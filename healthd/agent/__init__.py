"""The node agent: runs checks on its own node and publishes one verdict for it."""
