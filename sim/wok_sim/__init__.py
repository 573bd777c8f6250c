"""wok's fleet simulator and capacity planner.

Pure Python (no torch, no Kubernetes I/O): the simulator is a layer above the operator and calls
its own observation path and control law (`wok_operator.loop`, `wok_operator.control`), and reads
the step-time profiles and traces of `wok_contracts`, as the runtime's simulated accelerator does.
"""
