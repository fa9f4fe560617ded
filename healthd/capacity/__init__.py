"""What the published node state means for capacity, as pure functions over
Kubernetes objects: which nodes are unavailable and why (health), how much of each
resource they take away (quantities), and the lending limit that follows (lending).

The controller acts on it (healthd.controller); `healthd status` shows it
(healthd.fleet), so both read the cluster with the same rules.
"""
