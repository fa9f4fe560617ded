"""Simulation backends: fake NVML under the real pynvml, fake dcgmi, Kubernetes API
emulator. Used by tests, `healthd check --sim`, the demo and the benchmarks."""
