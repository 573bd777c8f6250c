"""wok: batching-aware autoscaling for LLM inference on Kubernetes (the `wok` command)."""
