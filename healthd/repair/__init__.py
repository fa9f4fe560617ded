"""Repairs: what healthd does to bring a bad node back (a GPU reset in place, a
reboot handed to the cluster's remediation, hardware inspection), decided purely from
the node's published state and the cluster's (healthd.repair.decision)."""
