"""healthd: GPU node fault detection and health remediation for Kubernetes."""

__version__ = "0.1.0"
