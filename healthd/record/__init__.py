"""`healthd record`: what this machine's GPUs show, written as a machine spec that
`--sim` replays.

- recording: reading the machine (one NVML pass, the kernel log, optional probes)
- command: the `healthd record` command line
"""
