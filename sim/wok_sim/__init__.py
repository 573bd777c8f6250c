"""wok's fleet simulator, capacity planner and engine step-time profiles.

Pure Python (no torch, no Kubernetes I/O): the simulator calls the operator's own observation path
and control law (`wok_operator.loop`, `wok_operator.control`), and the runtime's simulated
accelerator reads the same profile format (`wok_contracts.profile`).
"""
