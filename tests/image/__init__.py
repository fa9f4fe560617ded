"""healthd's image, built with podman from `Containerfile` (tests/image/build.py) and
run the way the agent's DaemonSet Pod runs it, its settings read from the rendered
manifests (tests/image/pod.py)."""
