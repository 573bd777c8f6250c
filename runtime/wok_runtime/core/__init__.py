"""The engine core, nano-vllm's shape: per-request state (`sequence`), KV-block bookkeeping
(`block_manager`), the batch each step (`scheduler`), the model and its forward (`model`,
`model_runner`), sampling, and the step loop that wires them (`engine`)."""
