"""A real Kubernetes control plane for tests and `wok dev`: upstream binaries, emulated GPU
nodes, pods backed by local processes, a real Prometheus."""
