from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

API_VERSION_1: ApiVersion
API_VERSION_2: ApiVersion
API_VERSION_3: ApiVersion
API_VERSION_UNSPECIFIED: ApiVersion
DESCRIPTOR: _descriptor.FileDescriptor
DTYPE_FLOAT32: DType
DTYPE_UNSPECIFIED: DType
ERROR_REASON_API_VERSION: ErrorReason
ERROR_REASON_BAD_EVALUATION: ErrorReason
ERROR_REASON_BAD_HELLO: ErrorReason
ERROR_REASON_BAD_TENSOR: ErrorReason
ERROR_REASON_BAD_VALUE: ErrorReason
ERROR_REASON_DAEMON_STOPPING: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_MODEL_MISMATCH: ErrorReason
ERROR_REASON_NOT_READY: ErrorReason
ERROR_REASON_NO_CHECKPOINT: ErrorReason
ERROR_REASON_NO_SESSION: ErrorReason
ERROR_REASON_PROTOCOL: ErrorReason
ERROR_REASON_STEP_ORDER: ErrorReason
ERROR_REASON_TRAINER_CONNECTED: ErrorReason
ERROR_REASON_UNSPECIFIED: ErrorReason
UPDATE_KIND_DELTA: UpdateKind
UPDATE_KIND_MODEL: UpdateKind
UPDATE_KIND_UNSPECIFIED: UpdateKind

class BarrierReply(_message.Message):
    __slots__ = ["checks", "lr_scale", "population", "reason", "step", "waited_s"]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    POPULATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    checks: int
    lr_scale: float
    population: float
    reason: str
    step: int
    waited_s: float
    def __init__(self, step: _Optional[int] = ..., waited_s: _Optional[float] = ..., checks: _Optional[int] = ..., reason: _Optional[str] = ..., population: _Optional[float] = ..., lr_scale: _Optional[float] = ...) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ["step"]
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ["path", "step"]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ["params", "step"]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    params: Tensor
    step: int
    def __init__(self, step: _Optional[int] = ..., params: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class DaemonMessage(_message.Message):
    __slots__ = ["params_request", "state_chunk", "waiting", "welcome"]
    PARAMS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STATE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    params_request: ParamsRequest
    state_chunk: StateChunk
    waiting: Waiting
    welcome: Welcome
    def __init__(self, waiting: _Optional[_Union[Waiting, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., params_request: _Optional[_Union[ParamsRequest, _Mapping]] = ..., state_chunk: _Optional[_Union[StateChunk, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ["api_version", "client", "dtype", "model_id", "model_name", "num_params", "shared_memory", "state_kind", "step"]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    STATE_KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    api_version: ApiVersion
    client: str
    dtype: DType
    model_id: int
    model_name: str
    num_params: int
    shared_memory: bool
    state_kind: str
    step: int
    def __init__(self, api_version: _Optional[_Union[ApiVersion, str]] = ..., model_name: _Optional[str] = ..., model_id: _Optional[int] = ..., num_params: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., step: _Optional[int] = ..., client: _Optional[str] = ..., shared_memory: bool = ..., state_kind: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ["accuracy", "addrs", "averages", "barrier_checks", "barrier_passes", "barrier_wait_s", "connected_peers", "forks_joined", "idle", "in_bytes", "isolated", "isolated_since", "join_error", "joined", "lineage", "loss", "models_averaged", "out_bytes", "peers_held_out", "population_error", "population_stderr", "reports_screened", "step_interval_s", "updates_norm_refused", "updates_received", "updates_rejected", "updates_sent", "uptime_s"]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    AVERAGES_FIELD_NUMBER: _ClassVar[int]
    BARRIER_CHECKS_FIELD_NUMBER: _ClassVar[int]
    BARRIER_PASSES_FIELD_NUMBER: _ClassVar[int]
    BARRIER_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_PEERS_FIELD_NUMBER: _ClassVar[int]
    FORKS_JOINED_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_SINCE_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    JOIN_ERROR_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MODELS_AVERAGED_FIELD_NUMBER: _ClassVar[int]
    OUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEERS_HELD_OUT_FIELD_NUMBER: _ClassVar[int]
    POPULATION_ERROR_FIELD_NUMBER: _ClassVar[int]
    POPULATION_STDERR_FIELD_NUMBER: _ClassVar[int]
    REPORTS_SCREENED_FIELD_NUMBER: _ClassVar[int]
    STEP_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    UPDATES_NORM_REFUSED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_SENT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    addrs: _containers.RepeatedScalarFieldContainer[str]
    averages: int
    barrier_checks: int
    barrier_passes: int
    barrier_wait_s: float
    connected_peers: int
    forks_joined: int
    idle: bool
    in_bytes: int
    isolated: bool
    isolated_since: str
    join_error: str
    joined: bool
    lineage: str
    loss: float
    models_averaged: int
    out_bytes: int
    peers_held_out: int
    population_error: str
    population_stderr: float
    reports_screened: int
    step_interval_s: float
    updates_norm_refused: int
    updates_received: int
    updates_rejected: int
    updates_sent: int
    uptime_s: float
    def __init__(self, addrs: _Optional[_Iterable[str]] = ..., connected_peers: _Optional[int] = ..., population_stderr: _Optional[float] = ..., population_error: _Optional[str] = ..., isolated: bool = ..., isolated_since: _Optional[str] = ..., idle: bool = ..., uptime_s: _Optional[float] = ..., step_interval_s: _Optional[float] = ..., barrier_checks: _Optional[int] = ..., barrier_passes: _Optional[int] = ..., barrier_wait_s: _Optional[float] = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ..., updates_sent: _Optional[int] = ..., updates_received: _Optional[int] = ..., updates_rejected: _Optional[int] = ..., updates_norm_refused: _Optional[int] = ..., models_averaged: _Optional[int] = ..., averages: _Optional[int] = ..., reports_screened: _Optional[int] = ..., joined: bool = ..., join_error: _Optional[str] = ..., lineage: _Optional[str] = ..., forks_joined: _Optional[int] = ..., peers_held_out: _Optional[int] = ..., in_bytes: _Optional[int] = ..., out_bytes: _Optional[int] = ...) -> None: ...

class ParamsReply(_message.Message):
    __slots__ = ["id", "params", "state", "step"]
    ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    id: int
    params: Tensor
    state: TrainerState
    step: int
    def __init__(self, id: _Optional[int] = ..., step: _Optional[int] = ..., params: _Optional[_Union[Tensor, _Mapping]] = ..., state: _Optional[_Union[TrainerState, _Mapping]] = ...) -> None: ...

class ParamsRequest(_message.Message):
    __slots__ = ["id", "state_length", "state_offset", "want_state"]
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    STATE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WANT_STATE_FIELD_NUMBER: _ClassVar[int]
    id: int
    state_length: int
    state_offset: int
    want_state: bool
    def __init__(self, id: _Optional[int] = ..., want_state: bool = ..., state_offset: _Optional[int] = ..., state_length: _Optional[int] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ["step"]
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ["accuracy", "has_eval", "loss", "step", "update"]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    HAS_EVAL_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    has_eval: bool
    loss: float
    step: int
    update: Tensor
    def __init__(self, step: _Optional[int] = ..., update: _Optional[_Union[Tensor, _Mapping]] = ..., has_eval: bool = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ["merged", "reset", "update"]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    merged: int
    reset: Reset
    update: Tensor
    def __init__(self, merged: _Optional[int] = ..., update: _Optional[_Union[Tensor, _Mapping]] = ..., reset: _Optional[_Union[Reset, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Reset(_message.Message):
    __slots__ = ["lineage", "params", "reason", "step"]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    lineage: str
    params: Tensor
    reason: str
    step: int
    def __init__(self, step: _Optional[int] = ..., params: _Optional[_Union[Tensor, _Mapping]] = ..., lineage: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SharedMemoryReady(_message.Message):
    __slots__ = ["error", "ok"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    error: str
    ok: bool
    def __init__(self, ok: bool = ..., error: _Optional[str] = ...) -> None: ...

class SharedRegion(_message.Message):
    __slots__ = ["offset"]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ["data", "error", "failed", "offset"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    error: str
    failed: bool
    offset: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., failed: bool = ..., error: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ["barrier", "exchange", "health", "job", "known_peers", "model_name", "node", "num_params", "peer_id", "population", "step", "trainer_client", "trainer_connected", "waiting"]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    KNOWN_PEERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    POPULATION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRAINER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    barrier: str
    exchange: str
    health: str
    job: str
    known_peers: int
    model_name: str
    node: NodeStatus
    num_params: int
    peer_id: str
    population: float
    step: int
    trainer_client: str
    trainer_connected: bool
    waiting: bool
    def __init__(self, peer_id: _Optional[str] = ..., job: _Optional[str] = ..., step: _Optional[int] = ..., population: _Optional[float] = ..., known_peers: _Optional[int] = ..., waiting: bool = ..., health: _Optional[str] = ..., trainer_connected: bool = ..., trainer_client: _Optional[str] = ..., barrier: _Optional[str] = ..., exchange: _Optional[str] = ..., model_name: _Optional[str] = ..., num_params: _Optional[int] = ..., node: _Optional[_Union[NodeStatus, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StepReply(_message.Message):
    __slots__ = ["barrier", "pull"]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    barrier: BarrierReply
    pull: PullReply
    def __init__(self, barrier: _Optional[_Union[BarrierReply, _Mapping]] = ..., pull: _Optional[_Union[PullReply, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ["accuracy", "has_eval", "loss", "step", "update"]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    HAS_EVAL_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    has_eval: bool
    loss: float
    step: int
    update: Tensor
    def __init__(self, step: _Optional[int] = ..., update: _Optional[_Union[Tensor, _Mapping]] = ..., has_eval: bool = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ["data", "shared"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    shared: SharedRegion
    def __init__(self, data: _Optional[bytes] = ..., shared: _Optional[_Union[SharedRegion, _Mapping]] = ...) -> None: ...

class TrainerMessage(_message.Message):
    __slots__ = ["hello", "params", "shm_ready"]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    SHM_READY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    params: ParamsReply
    shm_ready: SharedMemoryReady
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., params: _Optional[_Union[ParamsReply, _Mapping]] = ..., shm_ready: _Optional[_Union[SharedMemoryReady, _Mapping]] = ...) -> None: ...

class TrainerState(_message.Message):
    __slots__ = ["data", "kind", "offset", "step", "total_size"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    kind: str
    offset: int
    step: int
    total_size: int
    def __init__(self, kind: _Optional[str] = ..., step: _Optional[int] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ...) -> None: ...

class Waiting(_message.Message):
    __slots__ = ["reason", "waited_s"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    reason: str
    waited_s: float
    def __init__(self, reason: _Optional[str] = ..., waited_s: _Optional[float] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ["barrier", "exchange", "has_params", "job", "lr_scale", "max_abs_value", "model_id", "params", "params_source", "peer_id", "population", "session", "shm_offset", "shm_path", "shm_size", "state", "state_source", "step", "update_kind"]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    HAS_PARAMS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_VALUE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    POPULATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SHM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHM_PATH_FIELD_NUMBER: _ClassVar[int]
    SHM_SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    barrier: str
    exchange: str
    has_params: bool
    job: str
    lr_scale: float
    max_abs_value: float
    model_id: int
    params: Tensor
    params_source: str
    peer_id: str
    population: float
    session: str
    shm_offset: int
    shm_path: str
    shm_size: int
    state: TrainerState
    state_source: str
    step: int
    update_kind: UpdateKind
    def __init__(self, session: _Optional[str] = ..., step: _Optional[int] = ..., has_params: bool = ..., params: _Optional[_Union[Tensor, _Mapping]] = ..., params_source: _Optional[str] = ..., job: _Optional[str] = ..., peer_id: _Optional[str] = ..., barrier: _Optional[str] = ..., exchange: _Optional[str] = ..., update_kind: _Optional[_Union[UpdateKind, str]] = ..., population: _Optional[float] = ..., lr_scale: _Optional[float] = ..., max_abs_value: _Optional[float] = ..., shm_path: _Optional[str] = ..., shm_size: _Optional[int] = ..., model_id: _Optional[int] = ..., shm_offset: _Optional[int] = ..., state: _Optional[_Union[TrainerState, _Mapping]] = ..., state_source: _Optional[str] = ...) -> None: ...

class ApiVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class UpdateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
