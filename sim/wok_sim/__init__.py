"""wok's fleet simulator and capacity planner.

Pure Python (no torch, no Kubernetes I/O): the simulator calls the operator's own observation path
and control law (`wok_operator.loop`, `wok_operator.control`: the one declared seam between the
two), and reads the step-time profiles and traces of `wok_contracts`, as the runtime's simulated
accelerator does.
"""
