"""The columns of `wok simulate`'s table and what each means, apart from the simulator: the CLI
builds its --help from them without importing anything heavy (`wok --help` must start in images
that lack the operator's or the runtime's dependencies)."""

from __future__ import annotations

#: The table's columns: header and what it means. `wok simulate --help` prints these, and
#: tests keep the table's headers and docs/simulate.md in step with them.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "the policy's name (the list below)"),
    (
        "B",
        "the fixed batch size a baseline ran at, the best of its sweep over B in hindsight; "
        "- for a policy that moves its batch",
    ),
    ("all", "share of requests within every SLO: TTFT, TPOT and E2E (when --slo-e2e is set)"),
    ("TTFT", "share of requests whose first token came within --slo-ttft of their arrival"),
    ("TPOT", "share of requests whose mean time per output token was within --slo-tpot"),
    ("E2E", "share of requests that finished within --slo-e2e (finished at all, when unset)"),
    ("p99TTFT", "99th percentile time to first token of the requests that completed (s)"),
    ("p99TPOT", "99th percentile mean time per output token of the completed requests (s)"),
    ("p99E2E", "99th percentile end-to-end latency of the completed requests (s)"),
    ("GPU-h", "GPU-hours billed: every pod from its creation (pending pods bill) to its exit"),
    ("GPUh/1k", "GPU-hours per 1,000 output tokens served"),
    ("scale", "changes of the replica count"),
    ("flips", "changes of the replica count that reverse the previous change's direction"),
    ("maxQ", "the most requests waiting in the fleet's queues at one instant"),
    ("rej", "requests refused: a full queue (429) or no ready pod (503); each a miss"),
    ("tmo", "requests that waited in a queue past the runtime's queue timeout; each a miss"),
    (
        "drop",
        "requests still running or queued when their pod was removed and its drain ran "
        "out, or when the run ended; each a miss",
    ),
    ("hit", "share of prompt tokens served from a pod's prefix cache (the trace's hash_ids)"),
)
