"""The wok runtime: a PyTorch continuous-batching inference server that runs in every GPU pod."""
