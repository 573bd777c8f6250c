"""The InferenceService API: the one definition that the CRD, the operator and the docs share.

The CRD YAML under `crds/` is generated from these models (`wok crds`), so a field exists in
exactly one place. Defaults are chosen so that a first `kubectl apply` of a two-line spec works.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from wok_contracts.profile import StepProfile

GROUP = "wok.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["wis"]
API_VERSION = f"{GROUP}/{VERSION}"

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]
# A GPU's memory with its unit: a bare `80` is a valid quantity (80 bytes) that nobody means.
BYTES_WITH_UNIT_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)$"
BytesWithUnit = Annotated[str, Field(pattern=BYTES_WITH_UNIT_PATTERN)]
Dtype = Literal["float32", "float16", "bfloat16"]


def cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def quantity_bytes(value: str | int | float) -> int:
    """Bytes of a Kubernetes quantity such as `80Gi` or `512M`."""
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise ValueError(f"not a quantity: {value!r} (expected e.g. 80Gi, 512Mi)") from None
    if amount < 0:
        raise ValueError(f"quantity must not be negative: {value!r}")
    return int(amount)


def section(model: type[ApiModel]) -> Any:
    """A spec section that may be left out; `default: {}` lets the apiserver fill in its fields."""
    return Field(default_factory=model, json_schema_extra={"default": {}})


#: The decoder families the runtime serves (transformers' `model_type`): the one list that the
#: CRD's enum, the budget and the docs share with `wok_runtime.core.model_config.MODEL_TYPES`.
ModelType = Literal["llama", "mistral", "qwen2", "qwen3"]


class Architecture(ApiModel):
    """The shape of a Llama-family decoder: enough to size weights and the KV cache."""

    model_type: ModelType = Field(
        default="llama",
        description="The family (config.json's model_type): llama (Llama 2, 3, 3.1-3.3), "
        "mistral (7B v0.2/v0.3, no sliding window), qwen2 (Qwen2, Qwen2.5), qwen3 (dense). "
        "Any other is refused: the runtime cannot serve it.",
    )
    num_hidden_layers: int = Field(ge=1, le=1024)
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int | None = Field(default=None, ge=1, description="Defaults to hidden/heads.")
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(default=4096, ge=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> Architecture:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("numAttentionHeads must be a multiple of numKeyValueHeads")
        return self

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


class VolumeSource(ApiModel):
    claim_name: str = Field(min_length=1, description="PersistentVolumeClaim holding the model.")
    mount_path: str = Field(default="/models", pattern=r"^/")
    read_only: bool = True


class ModelSpec(ApiModel):
    source: str = Field(
        default="builtin:tiny",
        max_length=1024,
        pattern=r"^((builtin|sim):[a-z0-9][a-z0-9.-]*|/.+)$",
        description="`builtin:<name>`, the absolute path of an HF-format directory in a "
        "mounted volume, or `sim:<profile>`: a simulated accelerator that serves with the "
        "profile's step times and KV capacity and no model (`model.preset` names the model it "
        "stands for, which sizes the budget).",
    )
    served_name: str | None = Field(
        default=None, max_length=253, description="Model name in the OpenAI API."
    )
    preset: str | None = Field(
        default=None,
        max_length=63,
        description="A wok preset architecture (see `wok budget --list`).",
    )
    architecture: Architecture | None = Field(
        default=None, description="Explicit architecture (else the preset or builtin's)."
    )
    dtype: Dtype = "float16"
    volume: VolumeSource | None = None


class RuntimeSpec(ApiModel):
    image: str = Field(
        default="ghcr.io/wok-dev/wok-runtime:0.1.0",
        max_length=1024,
        description="wok's runtime image (engine: vllm: the one that writes a builtin model "
        "for vLLM to load; vllm.image runs the server).",
    )
    gpus_per_pod: int = Field(
        default=1,
        ge=1,
        le=16,
        description="GPUs of one pod: above 1, the model is split over them by tensor "
        "parallelism (heads and MLP columns; they must divide by it).",
    )
    gpu_memory: BytesWithUnit = Field(
        default="80Gi", description="Memory of one GPU, with its unit (80Gi, 141G)."
    )
    cpu: Quantity = "2"
    memory: Quantity | None = Field(
        default=None,
        description="The pod's memory request and limit. Default: from the budget, the weights "
        "(on the host while they load) plus the runtime's overhead; a sim: source needs little.",
    )
    drain_seconds: int = Field(default=30, ge=0, le=3600, description="Graceful drain on stop.")
    sim_load_seconds: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="`sim:` sources only: how long a pod takes to load (default: the profile's).",
    )
    compile: bool = Field(
        default=False,
        description="Serve with `--compile`: the step compiled by inductor and the CPU kernels, "
        "native code built at the pod's first start for the node's CPU (tens of seconds).",
    )
    compile_cache_host_path: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^/",
        description="With `compile`: a directory on the node that keeps the builds across pods "
        "(a hostPath, one subdirectory per CPU), so only the first pod on a node builds. "
        "Default: the pod's own cache, built again by every pod.",
    )


class BatchingSpec(ApiModel):
    mode: Literal["continuous", "static", "serial"] = "continuous"
    apply_to_engine: Literal["never", "restart"] = Field(
        default="never",
        description="engine: vllm only (vLLM cannot change max-num-seqs live): `never` keeps "
        "the pods' --max-num-seqs at the cap the spec implies and reports the batch the law "
        "would run in status; `restart` renders the law's batch into the pods' arguments, so "
        "every change of it rolls the pods.",
    )
    min_batch_size: int = Field(default=1, ge=1, le=4096)
    max_batch_size: int = Field(
        default=256, ge=1, le=4096, description="B_max; the memory budget (B_mem) caps it too."
    )
    initial_batch_size: int = Field(default=32, ge=1, le=4096)
    max_wait_ms: int = Field(default=10, ge=0, le=60_000)
    step: int = Field(
        default=4,
        ge=1,
        le=1024,
        description=(
            "η_B: the batch step down, once per SLO window, on a TPOT breach a pod did not fix."
        ),
    )
    max_num_batched_tokens: int = Field(default=2048, ge=16, le=1 << 20)
    batch_lane_max_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="The batch lane's cap while no online request runs or waits (a big "
        "batch over a long window); default: the memory cap, as many maxModelLen sequences as the "
        "pod's KV cache holds. The runtime clamps it to its KV capacity.",
    )


class BatchLaneSpec(ApiModel):
    """Offline work (`"priority": "batch"`): served from what online leaves free."""

    complete_within_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="Opt-in: add replicas when the batch lane's backlog cannot finish within "
        "this long at the current capacity (pending tokens over the measured batch-lane token "
        "rate). Unset: a backlog never adds replicas.",
    )


class PriorityClass(ApiModel):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    priority: int = Field(ge=0, le=9, description="Lower is served first.")


def default_priority_classes() -> list[PriorityClass]:
    return [
        PriorityClass(name="interactive", priority=0),
        PriorityClass(name="standard", priority=1),
        PriorityClass(name="batch", priority=2),
    ]


class QueueSpec(ApiModel):
    max_length: int = Field(default=256, ge=1, le=1_000_000)
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    priority_classes: list[PriorityClass] = Field(
        default_factory=default_priority_classes,
        min_length=1,
        max_length=10,
        json_schema_extra={
            "default": [c.model_dump(by_alias=True) for c in default_priority_classes()]
        },
    )
    aging_seconds: float = Field(
        default=10.0, gt=0, le=3600, description="Waiting this long raises priority by one."
    )

    @field_validator("priority_classes")
    @classmethod
    def _unique_names(cls, classes: list[PriorityClass]) -> list[PriorityClass]:
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError("priority class names must be unique")
        return classes


class MemorySpec(ApiModel):
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=0.98)
    max_model_len: int = Field(default=2048, ge=16, le=1 << 20)
    reserve: Quantity = Field(default="512Mi", description="Kept free for the CUDA context etc.")
    length_estimate: Literal["maxModelLen", "observedMean"] = Field(
        default="observedMean",
        description="L in B_mem: the observed mean sequence length (maxModelLen until one is "
        "known), or always maxModelLen (no preemption ever, a far smaller batch).",
    )
    kv_usage_ceiling: float = Field(
        default=0.95, gt=0, le=1, description="KV usage above this pushes the batch down."
    )


class StepProfileSpec(ApiModel):
    """What one engine step costs on this model and GPU, `wok profile`'s fit of
    `fixedSeconds + secondsPerSequence·decodes + secondsPerPrefillToken·prefill +
    secondsPerContextToken·context`, with the pod's step token budget and KV pool."""

    fixed_seconds: float = Field(gt=0, description="a: the fixed cost of a step.")
    seconds_per_sequence: float = Field(ge=0, description="b: per decoding sequence.")
    seconds_per_prefill_token: float = Field(ge=0, description="c: per prompt token.")
    seconds_per_context_token: float = Field(ge=0, description="d: per cached token read.")
    step_token_budget: int = Field(
        ge=1, description="The pods' max_num_batched_tokens (batching.maxNumBatchedTokens)."
    )
    kv_capacity_tokens: int = Field(ge=16, description="Tokens the pod's KV pool holds.")

    def profile(self, max_model_len: int) -> StepProfile:
        return StepProfile(
            name="spec.scaling.stepProfile",
            kind="measured",
            device="",
            a_s=self.fixed_seconds,
            b_s_per_seq=self.seconds_per_sequence,
            c_s_per_prefill_token=self.seconds_per_prefill_token,
            d_s_per_context_token=self.seconds_per_context_token,
            step_token_budget=self.step_token_budget,
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_model_len=max_model_len,
        )

    @classmethod
    def of(cls, profile: StepProfile) -> StepProfileSpec:
        return cls(
            fixed_seconds=profile.a_s,
            seconds_per_sequence=profile.b_s_per_seq,
            seconds_per_prefill_token=profile.c_s_per_prefill_token,
            seconds_per_context_token=profile.d_s_per_context_token,
            step_token_budget=profile.step_token_budget,
            kv_capacity_tokens=profile.kv_capacity_tokens,
        )


class ScalingSpec(ApiModel):
    replicas: Literal["wok", "external"] = Field(
        default="wok",
        description="Who owns the replica count: `wok` (the law moves it), or `external` "
        "(`kubectl scale`, an HPA or a KEDA ScaledObject writes spec.replicas through the scale "
        "subresource; wok then moves only the batch size: minReplicas, maxReplicas, maxStep and "
        "the stabilization windows no longer apply).",
    )
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=4, ge=0, le=1000)
    max_step: int = Field(
        default=4,
        ge=1,
        le=100,
        description="The most replicas one decision adds (a scale-down goes straight to the "
        "largest need of its stabilization window).",
    )
    target_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="ρ while every P99 over the SLO's budget window meets its SLO: the share of "
        "a pod's batch slots and measured throughput that demand may fill.",
    )
    breached_utilization: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="ρ while a P99 over the budget window breaks its SLO (the error budget is "
        "spent: the traffic outran the fleet within a pod start): the rest is headroom for bursts "
        "while new pods start.",
    )
    target_queue_per_replica: float = Field(
        default=2.0, ge=0, description="Q*: a longer queue raises the batch (TPOT permitting)."
    )
    deadband: float = Field(default=1.0, ge=0, description="|Q − Q*| within this holds.")
    scale_up_stabilization_seconds: int = Field(
        default=10, ge=0, le=3600, description="Demand must ask for more pods this long."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=86_400,
        description="Demand must ask for fewer pods this long (the HPA's default window).",
    )
    pod_start_seconds: int = Field(
        default=90,
        ge=0,
        le=3600,
        description="How long a new pod takes to serve (image, weights): a windowed latency "
        "signal waits this long plus the SLO window before asking for another pod.",
    )
    interval_seconds: int = Field(default=5, ge=1, le=3600)
    step_profile: StepProfileSpec | None = Field(
        default=None,
        description="What a step costs on this model and GPU (`wok profile`): μ, the requests/s "
        "a pod serves, is then the profile's capacity for the mix the service finishes, "
        "corrected by what saturated pods show. Without it μ waits for a saturated pod.",
    )


class SLOSpec(ApiModel):
    ttft_p99_seconds: float = Field(
        default=2.0, gt=0, le=3600, description="P99 time to first token; rejections miss it."
    )
    tpot_p99_seconds: float = Field(
        default=0.1, gt=0, le=60, description="P99 of each request's mean time per output token."
    )
    e2e_p99_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        alias="e2eP99Seconds",  # to_camel would say e2EP99Seconds
        description="Optional P99 end-to-end latency.",
    )
    window_seconds: int = Field(default=60, ge=10, le=86_400)
    budget_window_seconds: int = Field(
        default=3600,
        ge=60,
        le=86_400,
        description="The error budget's window: a P99 over it above its SLO means more than 1 % "
        "of its requests missed, and the replicas keep breachedUtilization's headroom.",
    )


Engine = Literal["wok", "vllm"]
#: vLLM's OpenAI server image: the version whose metrics and flags the operator renders and reads.
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


class VllmSpec(ApiModel):
    """engine: vllm only: what vLLM has that wok's runtime spec does not name."""

    image: str = Field(default=VLLM_IMAGE, max_length=1024, description="vLLM's OpenAI server.")
    enable_prefix_caching: bool = Field(
        default=True,
        description="Automatic prefix caching (vLLM's default): false renders "
        "--no-enable-prefix-caching.",
    )


class MetricsSpec(ApiModel):
    prometheus_url: str | None = Field(
        default=None, pattern=r"^https?://", description="Else the operator's default."
    )


SIM_ONLY = "runtime.simLoadSeconds applies to sim: sources only (a real model loads as it loads)"
ONE_OWNER = (
    "spec.replicas is for kubectl scale, an HPA or KEDA, but wok owns the replica count: "
    "set scaling.replicas: external to hand it over (one owner at a time)"
)
EXTERNAL_COUNT = (
    "scaling.replicas: external needs spec.replicas, the count the external autoscaler starts from"
)
VLLM_CONTINUOUS = "engine: vllm batches continuously only: leave batching.mode continuous"
VLLM_NO_SIM = (
    "engine: vllm serves a real model: a sim: source runs on wok's runtime only (engine: wok)"
)
VLLM_NO_BATCH_LANE = (
    "engine: vllm has no batch lane: batching.batchLaneMaxBatchSize and "
    "batchLane.completeWithinSeconds apply to engine: wok only"
)
VLLM_STEP_BUDGET = (
    "engine: vllm refuses a step token budget below its batch: batching.maxNumBatchedTokens "
    "must be at least batching.maxBatchSize"
)
VLLM_ONLY = "spec.vllm and batching.applyToEngine: restart apply to engine: vllm only"
_QUEUE_DEFAULTS = {
    "timeout": QueueSpec.model_fields["timeout_seconds"].default,
    "aging": QueueSpec.model_fields["aging_seconds"].default,
    "wait": BatchingSpec.model_fields["max_wait_ms"].default,
}
_DEFAULT_CLASSES = [f"{c.name}={c.priority}" for c in default_priority_classes()]
VLLM_WOK_QUEUE = (
    "engine: vllm has no queue timeout, aging, priority classes or batch wait: leave "
    "queue.timeoutSeconds, queue.agingSeconds, queue.priorityClasses and batching.maxWaitMs "
    "unset (queue.maxLength applies: it bounds vLLM's queue)"
)


def vllm_rules() -> list[dict[str, str]]:
    """What makes no sense for vLLM, refused at apply. A field with a default is always present
    by the time CEL runs, so a wok-only one is refused when it differs from its default."""
    # Element by element: a map() over the list costs more than the apiserver's CEL budget.
    defaults = default_priority_classes()
    classes = " && ".join(
        f"self.queue.priorityClasses[{i}].name == '{c.name}' && "
        f"self.queue.priorityClasses[{i}].priority == {c.priority}"
        for i, c in enumerate(defaults)
    )
    not_vllm = "self.engine != 'vllm'"
    return [
        cel(f"{not_vllm} || self.batching.mode == 'continuous'", VLLM_CONTINUOUS),
        cel(f"{not_vllm} || !self.model.source.startsWith('sim:')", VLLM_NO_SIM),
        cel(
            f"{not_vllm} || (!has(self.batching.batchLaneMaxBatchSize) && "
            "!has(self.batchLane.completeWithinSeconds))",
            VLLM_NO_BATCH_LANE,
        ),
        cel(
            f"{not_vllm} || self.batching.maxNumBatchedTokens >= self.batching.maxBatchSize",
            VLLM_STEP_BUDGET,
        ),
        cel(
            f"{not_vllm} || (self.queue.timeoutSeconds == {_QUEUE_DEFAULTS['timeout']!r} && "
            f"self.queue.agingSeconds == {_QUEUE_DEFAULTS['aging']!r} && "
            f"self.batching.maxWaitMs == {_QUEUE_DEFAULTS['wait']!r} && "
            f"self.queue.priorityClasses.size() == {len(defaults)} && {classes})",
            VLLM_WOK_QUEUE,
        ),
        cel(
            "self.engine == 'vllm' || (!has(self.vllm) && self.batching.applyToEngine == 'never')",
            VLLM_ONLY,
        ),
    ]


def vllm_violation(spec: InferenceServiceSpec) -> str | None:
    """The first of `vllm_rules` that `spec` breaks, in Python (no apiserver), or None."""
    b, q = spec.batching, spec.queue
    if spec.engine != "vllm":
        wrong = spec.vllm is not None or b.apply_to_engine != "never"
        return VLLM_ONLY if wrong else None
    classes = [f"{c.name}={c.priority}" for c in q.priority_classes]
    checks = [
        (b.mode == "continuous", VLLM_CONTINUOUS),
        (not spec.model.source.startswith("sim:"), VLLM_NO_SIM),
        (
            b.batch_lane_max_batch_size is None and spec.batch_lane.complete_within_seconds is None,
            VLLM_NO_BATCH_LANE,
        ),
        (b.max_num_batched_tokens >= b.max_batch_size, VLLM_STEP_BUDGET),
        (
            q.timeout_seconds == _QUEUE_DEFAULTS["timeout"]
            and q.aging_seconds == _QUEUE_DEFAULTS["aging"]
            and b.max_wait_ms == _QUEUE_DEFAULTS["wait"]
            and classes == _DEFAULT_CLASSES,
            VLLM_WOK_QUEUE,
        ),
    ]
    return next((message for ok, message in checks if not ok), None)


class InferenceServiceSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.batching.minBatchSize <= self.batching.initialBatchSize && "
                    "self.batching.initialBatchSize <= self.batching.maxBatchSize",
                    "batching: minBatchSize <= initialBatchSize <= maxBatchSize must hold",
                ),
                cel(
                    "self.scaling.minReplicas <= self.scaling.maxReplicas",
                    "scaling: minReplicas must not exceed maxReplicas",
                ),
                cel("self.scaling.replicas == 'external' || !has(self.replicas)", ONE_OWNER),
                cel("self.scaling.replicas != 'external' || has(self.replicas)", EXTERNAL_COUNT),
                cel(
                    "self.memory.maxModelLen <= self.batching.maxNumBatchedTokens || "
                    "self.batching.mode == 'continuous'",
                    "static and serial batching cannot chunk prefills: "
                    "maxNumBatchedTokens must be at least memory.maxModelLen",
                ),
                cel(
                    "self.model.source.startsWith('builtin:') || has(self.model.preset) || "
                    "has(self.model.architecture)",
                    "model: a path or sim: source needs model.preset or model.architecture "
                    "so the operator can size the KV cache",
                ),
                cel(
                    "!has(self.runtime.simLoadSeconds) || self.model.source.startsWith('sim:')",
                    SIM_ONLY,
                ),
                cel(
                    "!self.model.source.startsWith('/') || has(self.model.volume)",
                    "model: a path source needs model.volume (the claim that holds it)",
                ),
                *vllm_rules(),
            ]
        }
    )

    engine: Engine = Field(
        default="wok",
        description="The engine the pods run: `wok` (the bundled runtime: the law moves its "
        "batch live) or `vllm` (vLLM's OpenAI server: the law moves the replicas; the batch cap "
        "is fixed per pod, see batching.applyToEngine).",
    )

    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="The replica count when `scaling.replicas: external`: written by `kubectl "
        "scale`, an HPA or KEDA through the scale subresource, propagated to the Deployment.",
    )
    model: ModelSpec = section(ModelSpec)
    runtime: RuntimeSpec = section(RuntimeSpec)
    batching: BatchingSpec = section(BatchingSpec)
    queue: QueueSpec = section(QueueSpec)
    memory: MemorySpec = section(MemorySpec)
    scaling: ScalingSpec = section(ScalingSpec)
    slo: SLOSpec = section(SLOSpec)
    metrics: MetricsSpec = section(MetricsSpec)
    batch_lane: BatchLaneSpec = section(BatchLaneSpec)
    vllm: VllmSpec | None = Field(
        default=None, description="engine: vllm only: its image and vLLM-only switches."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceServiceSpec:
        # The same rules as the CEL above, so Python callers get them without an apiserver.
        b, s = self.batching, self.scaling
        if not b.min_batch_size <= b.initial_batch_size <= b.max_batch_size:
            raise ValueError("batching: minBatchSize <= initialBatchSize <= maxBatchSize must hold")
        if s.min_replicas > s.max_replicas:
            raise ValueError("scaling: minReplicas must not exceed maxReplicas")
        if s.replicas == "wok" and self.replicas is not None:
            raise ValueError(ONE_OWNER)
        if s.replicas == "external" and self.replicas is None:
            raise ValueError(EXTERNAL_COUNT)
        if b.mode != "continuous" and self.memory.max_model_len > b.max_num_batched_tokens:
            raise ValueError(
                "static and serial batching cannot chunk prefills: "
                "maxNumBatchedTokens must be at least memory.maxModelLen"
            )
        source = self.model.source
        if not source.startswith("builtin:") and not (self.model.preset or self.model.architecture):
            raise ValueError(
                "model: a path or sim: source needs model.preset or model.architecture "
                "so the operator can size the KV cache"
            )
        if self.runtime.sim_load_seconds is not None and not source.startswith("sim:"):
            raise ValueError(SIM_ONLY)
        if source.startswith("/") and self.model.volume is None:
            raise ValueError("model: a path source needs model.volume (the claim that holds it)")
        violation = vllm_violation(self)
        if violation is not None:
            raise ValueError(violation)
        return self


class Condition(ApiModel):
    """The Kubernetes Condition shape (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class MemoryStatus(ApiModel):
    weights_bytes: int
    activation_bytes: int
    kv_cache_bytes: int
    reserve_bytes: int
    kv_bytes_per_token: int
    max_batch_by_memory: int
    sequence_length: int | None = None  # L of B_mem: maxModelLen or the observed mean


class DecisionInputs(ApiModel):
    queue_per_replica: float | None = None
    running_per_replica: float | None = None
    p99_ttft_seconds: float | None = None
    p99_tpot_seconds: float | None = None
    p99_seconds: float | None = None
    kv_usage: float | None = None
    ready_replicas: int = 0
    pending_replicas: int = 0
    reporting_replicas: int | None = None
    desired_replicas: int | None = None
    utilization: float | None = None  # ρ in force: targetUtilization or breachedUtilization
    budget_p99_ttft_seconds: float | None = None
    budget_p99_tpot_seconds: float | None = None
    budget_p99_seconds: float | None = None
    budget_p995_ttft_seconds: float | None = None  # half the budget is back once these are within
    budget_p995_tpot_seconds: float | None = None
    budget_p995_seconds: float | None = None
    batch_lane_requests: int | None = None
    batch_lane_pending_tokens: int | None = None
    batch_lane_replicas: int | None = None  # what the backlog's deadline needs (opt-in)


class Change(ApiModel):
    from_: int = Field(alias="from")
    to: int


class LastDecision(ApiModel):
    time: str
    inputs: DecisionInputs
    batch: Change
    replicas: Change
    reason: str


class LoopMemory(ApiModel):
    """The law's memory besides the knobs (`control.LoopState`); times are Unix seconds."""

    batch_direction: int = 0
    batch_run: int = 0
    last_batch_decrease: float | None = None
    up_since: float | None = None
    up_target: int | None = None
    down_since: float | None = None
    down_target: int | None = None
    last_scale_up: float | None = None
    last_replica_change: float | None = None
    service_rate: float | None = Field(
        default=None, description="Requests/s the law believes a pod serves (μ)."
    )
    service_rate_at: float | None = None
    capacity_source: Literal["profile", "observed"] | None = Field(
        default=None,
        description="Where μ came from: the step profile's prior, or a saturated pod's rate.",
    )
    capacity_ratio: float | None = Field(
        default=None,
        description="What saturated pods served ÷ the step profile's capacity for their mix.",
    )
    proven_rate: float | None = None
    proven_rate_at: float | None = None
    learned_for: str | None = Field(
        default=None, description="Hash of the model, GPU and SLOs the learnt rates hold for."
    )
    saturated_since: float | None = None
    waiting_since: float | None = None
    queued_since: float | None = None
    breached_since: float | None = None
    budget_spent: bool = False
    burst_at: float | None = Field(
        default=None, description="When the traffic last outran the fleet the law asked for."
    )
    outrun_at: float | None = None
    started_at: float | None = None
    batch_sla: int | None = Field(
        default=None,
        description="B_SLA: the largest batch the step profile predicts keeps TPOT in its SLO.",
    )
    tpot_pod_p99: float | None = None
    tpot_futile: bool = False
    floor_since: float | None = None


class BatchLaneStatus(ApiModel):
    """The batch lane's backlog, summed over the pods, and when it would finish as things are."""

    requests: int | None = Field(default=None, description="Batch requests waiting or running.")
    pending_tokens: int | None = Field(
        default=None, description="Output tokens they still owe at most (their max_tokens)."
    )
    tokens_per_second: float | None = Field(
        default=None, description="The batch lane's measured output tokens/s (the SLO window)."
    )
    estimated_seconds: float | None = Field(
        default=None, description="pendingTokens / tokensPerSecond at the current capacity."
    )
    estimated_completion_time: str | None = None
    complete_within_seconds: float | None = None
    needed_replicas: int | None = Field(
        default=None, description="Replicas that finish it within completeWithinSeconds."
    )


class InferenceServiceStatus(ApiModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int | None = None
    ready_replicas: int | None = None
    selector: str | None = Field(
        default=None, description="The runtime pods' label selector (the scale subresource's)."
    )
    batch_size: int | None = None
    engine_batch_size: int | None = Field(
        default=None,
        description="engine: vllm: the --max-num-seqs its pods were started with (fixed per "
        "pod); batchSize is the batch the law would run, and the BatchApplied condition says "
        "whether the two differ.",
    )
    memory: MemoryStatus | None = None
    last_decision: LastDecision | None = None
    batch_lane: BatchLaneStatus | None = None
    controller: LoopMemory | None = Field(
        default=None,
        description="The control loop's memory (stabilization timers), kept across restarts.",
    )


class InferenceService(ApiModel):
    api_version: Literal["wok.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["InferenceService"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InferenceServiceSpec = Field(default_factory=InferenceServiceSpec)
    status: InferenceServiceStatus | None = None
