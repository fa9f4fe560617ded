"""Fleet tools for admins: `healthd trigger` (on-demand checks on many nodes through
the agents' annotation protocol) and `healthd status` (the fleet and the controller
at a glance). Both work through the Kubernetes API alone, so RBAC decides who may
look and who may ask; neither talks to an agent directly.
"""
