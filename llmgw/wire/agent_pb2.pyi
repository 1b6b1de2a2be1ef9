from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("protocol", "register", "heartbeat", "shard_status", "log_lines", "command_result", "engine_status", "kv_blocks", "fabric_test_output", "renew_certificate", "training_report", "training_piece")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    LOG_LINES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_STATUS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_TEST_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RENEW_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    TRAINING_REPORT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_PIECE_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    register: Register
    heartbeat: Heartbeat
    shard_status: ShardStatus
    log_lines: LogLines
    command_result: CommandResult
    engine_status: EngineStatus
    kv_blocks: KvBlocks
    fabric_test_output: FabricTestOutput
    renew_certificate: RenewCertificate
    training_report: TrainingReport
    training_piece: TrainingPiece
    def __init__(self, protocol: _Optional[int] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shard_status: _Optional[_Union[ShardStatus, _Mapping]] = ..., log_lines: _Optional[_Union[LogLines, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ..., engine_status: _Optional[_Union[EngineStatus, _Mapping]] = ..., kv_blocks: _Optional[_Union[KvBlocks, _Mapping]] = ..., fabric_test_output: _Optional[_Union[FabricTestOutput, _Mapping]] = ..., renew_certificate: _Optional[_Union[RenewCertificate, _Mapping]] = ..., training_report: _Optional[_Union[TrainingReport, _Mapping]] = ..., training_piece: _Optional[_Union[TrainingPiece, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("protocol", "command_id", "fencing_token", "start_shard", "stop_shard", "install_engine", "agent_settings", "request_logs", "restart", "registered", "slurm_jobs_recorded", "fabric_test", "certificate_renewed", "trust_certificates", "upgrade_agent", "wipe_node", "start_training", "cancel_training")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    START_SHARD_FIELD_NUMBER: _ClassVar[int]
    STOP_SHARD_FIELD_NUMBER: _ClassVar[int]
    INSTALL_ENGINE_FIELD_NUMBER: _ClassVar[int]
    AGENT_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_LOGS_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOBS_RECORDED_FIELD_NUMBER: _ClassVar[int]
    FABRIC_TEST_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_RENEWED_FIELD_NUMBER: _ClassVar[int]
    TRUST_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_AGENT_FIELD_NUMBER: _ClassVar[int]
    WIPE_NODE_FIELD_NUMBER: _ClassVar[int]
    START_TRAINING_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TRAINING_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    command_id: str
    fencing_token: int
    start_shard: StartShard
    stop_shard: StopShard
    install_engine: InstallEngine
    agent_settings: AgentSettings
    request_logs: RequestLogs
    restart: Restart
    registered: Registered
    slurm_jobs_recorded: SlurmJobsRecorded
    fabric_test: FabricTest
    certificate_renewed: CertificateRenewed
    trust_certificates: TrustCertificates
    upgrade_agent: UpgradeAgent
    wipe_node: WipeNode
    start_training: StartTraining
    cancel_training: CancelTraining
    def __init__(self, protocol: _Optional[int] = ..., command_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., start_shard: _Optional[_Union[StartShard, _Mapping]] = ..., stop_shard: _Optional[_Union[StopShard, _Mapping]] = ..., install_engine: _Optional[_Union[InstallEngine, _Mapping]] = ..., agent_settings: _Optional[_Union[AgentSettings, _Mapping]] = ..., request_logs: _Optional[_Union[RequestLogs, _Mapping]] = ..., restart: _Optional[_Union[Restart, _Mapping]] = ..., registered: _Optional[_Union[Registered, _Mapping]] = ..., slurm_jobs_recorded: _Optional[_Union[SlurmJobsRecorded, _Mapping]] = ..., fabric_test: _Optional[_Union[FabricTest, _Mapping]] = ..., certificate_renewed: _Optional[_Union[CertificateRenewed, _Mapping]] = ..., trust_certificates: _Optional[_Union[TrustCertificates, _Mapping]] = ..., upgrade_agent: _Optional[_Union[UpgradeAgent, _Mapping]] = ..., wipe_node: _Optional[_Union[WipeNode, _Mapping]] = ..., start_training: _Optional[_Union[StartTraining, _Mapping]] = ..., cancel_training: _Optional[_Union[CancelTraining, _Mapping]] = ...) -> None: ...

class SlurmJobsRecorded(_message.Message):
    __slots__ = ("until",)
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    until: float
    def __init__(self, until: _Optional[float] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "gpu_class", "device_id", "memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "compute_capability", "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max", "mig_enabled", "is_mig_instance", "parent_uuid", "ecc_enabled", "power_limit_watts", "foreign_pids", "numa_node", "nvlink_peers")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    PCIE_GEN_CURRENT_FIELD_NUMBER: _ClassVar[int]
    PCIE_GEN_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_CURRENT_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    IS_MIG_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    ECC_ENABLED_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_PIDS_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    gpu_class: str
    device_id: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    compute_capability: str
    pcie_gen_current: int
    pcie_gen_max: int
    pcie_width_current: int
    pcie_width_max: int
    mig_enabled: bool
    is_mig_instance: bool
    parent_uuid: str
    ecc_enabled: bool
    power_limit_watts: float
    foreign_pids: _containers.RepeatedScalarFieldContainer[int]
    numa_node: int
    nvlink_peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., gpu_class: _Optional[str] = ..., device_id: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ..., compute_capability: _Optional[str] = ..., pcie_gen_current: _Optional[int] = ..., pcie_gen_max: _Optional[int] = ..., pcie_width_current: _Optional[int] = ..., pcie_width_max: _Optional[int] = ..., mig_enabled: _Optional[bool] = ..., is_mig_instance: _Optional[bool] = ..., parent_uuid: _Optional[str] = ..., ecc_enabled: _Optional[bool] = ..., power_limit_watts: _Optional[float] = ..., foreign_pids: _Optional[_Iterable[int]] = ..., numa_node: _Optional[int] = ..., nvlink_peers: _Optional[_Iterable[str]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "address", "os", "arch", "cpu_model", "cpu_cores", "cpu_flags", "memory_total_bytes", "disk_free_bytes", "gpus", "engines_installed", "engines_installable", "features", "shards", "agent_version", "warnings", "labels", "node_secret", "release_key_id", "health")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    CPU_FLAGS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_INSTALLED_FIELD_NUMBER: _ClassVar[int]
    ENGINES_INSTALLABLE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NODE_SECRET_FIELD_NUMBER: _ClassVar[int]
    RELEASE_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    os: str
    arch: str
    cpu_model: str
    cpu_cores: int
    cpu_flags: _containers.RepeatedScalarFieldContainer[str]
    memory_total_bytes: int
    disk_free_bytes: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    engines_installed: _containers.RepeatedScalarFieldContainer[str]
    engines_installable: _containers.RepeatedScalarFieldContainer[str]
    features: _containers.RepeatedScalarFieldContainer[str]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    agent_version: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    node_secret: str
    release_key_id: str
    health: HealthReport
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., os: _Optional[str] = ..., arch: _Optional[str] = ..., cpu_model: _Optional[str] = ..., cpu_cores: _Optional[int] = ..., cpu_flags: _Optional[_Iterable[str]] = ..., memory_total_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., engines_installed: _Optional[_Iterable[str]] = ..., engines_installable: _Optional[_Iterable[str]] = ..., features: _Optional[_Iterable[str]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., agent_version: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., node_secret: _Optional[str] = ..., release_key_id: _Optional[str] = ..., health: _Optional[_Union[HealthReport, _Mapping]] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "utilization_percent", "memory_used_bytes", "power_draw_watts", "power_limit_watts", "temperature_celsius", "sm_clock_mhz", "clock_event_reasons", "ecc_uncorrected", "sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent", "foreign_pids", "memory_temperature_celsius")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_DRAW_WATTS_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SM_OCCUPANCY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DRAM_BANDWIDTH_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_PIDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization_percent: float
    memory_used_bytes: int
    power_draw_watts: float
    power_limit_watts: float
    temperature_celsius: float
    sm_clock_mhz: int
    clock_event_reasons: int
    ecc_uncorrected: int
    sm_active_percent: float
    sm_occupancy_percent: float
    tensor_active_percent: float
    dram_bandwidth_percent: float
    foreign_pids: _containers.RepeatedScalarFieldContainer[int]
    memory_temperature_celsius: float
    def __init__(self, index: _Optional[int] = ..., utilization_percent: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., power_draw_watts: _Optional[float] = ..., power_limit_watts: _Optional[float] = ..., temperature_celsius: _Optional[float] = ..., sm_clock_mhz: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., ecc_uncorrected: _Optional[int] = ..., sm_active_percent: _Optional[float] = ..., sm_occupancy_percent: _Optional[float] = ..., tensor_active_percent: _Optional[float] = ..., dram_bandwidth_percent: _Optional[float] = ..., foreign_pids: _Optional[_Iterable[int]] = ..., memory_temperature_celsius: _Optional[float] = ...) -> None: ...

class ProcessGroupSample(_message.Message):
    __slots__ = ("shard_id", "cpu_cores_used", "resident_memory_bytes", "engine")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_USED_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    cpu_cores_used: float
    resident_memory_bytes: int
    engine: EngineLoad
    def __init__(self, shard_id: _Optional[str] = ..., cpu_cores_used: _Optional[float] = ..., resident_memory_bytes: _Optional[int] = ..., engine: _Optional[_Union[EngineLoad, _Mapping]] = ...) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("requests_running", "requests_waiting", "kv_cache_usage", "prompt_tokens_total", "generation_tokens_total", "prefix_cache_hits_total", "prefix_cache_queries_total", "prefill_seconds_total", "prefill_tokens_total", "decode_seconds_total", "decode_tokens_total", "decode_requests_total", "steps_total", "busy_slots_per_step")
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DECODE_REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUSY_SLOTS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    requests_running: float
    requests_waiting: float
    kv_cache_usage: float
    prompt_tokens_total: float
    generation_tokens_total: float
    prefix_cache_hits_total: float
    prefix_cache_queries_total: float
    prefill_seconds_total: float
    prefill_tokens_total: float
    decode_seconds_total: float
    decode_tokens_total: float
    decode_requests_total: float
    steps_total: float
    busy_slots_per_step: float
    def __init__(self, requests_running: _Optional[float] = ..., requests_waiting: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., prompt_tokens_total: _Optional[float] = ..., generation_tokens_total: _Optional[float] = ..., prefix_cache_hits_total: _Optional[float] = ..., prefix_cache_queries_total: _Optional[float] = ..., prefill_seconds_total: _Optional[float] = ..., prefill_tokens_total: _Optional[float] = ..., decode_seconds_total: _Optional[float] = ..., decode_tokens_total: _Optional[float] = ..., decode_requests_total: _Optional[float] = ..., steps_total: _Optional[float] = ..., busy_slots_per_step: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "gpus", "cpu_percent", "load1", "memory_used_bytes", "memory_available_bytes", "shards", "shard_states", "engines_installed", "engines_installing", "sampled_at", "disk_free_bytes", "health", "slurm", "firewall", "memory_bandwidth", "sensors", "training_jobs")
    TIME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATES_FIELD_NUMBER: _ClassVar[int]
    ENGINES_INSTALLED_FIELD_NUMBER: _ClassVar[int]
    ENGINES_INSTALLING_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    SLURM_FIELD_NUMBER: _ClassVar[int]
    FIREWALL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    SENSORS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_JOBS_FIELD_NUMBER: _ClassVar[int]
    time: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    cpu_percent: float
    load1: float
    memory_used_bytes: int
    memory_available_bytes: int
    shards: _containers.RepeatedCompositeFieldContainer[ProcessGroupSample]
    shard_states: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    engines_installed: _containers.RepeatedScalarFieldContainer[str]
    engines_installing: _containers.RepeatedScalarFieldContainer[str]
    sampled_at: float
    disk_free_bytes: int
    health: HealthReport
    slurm: SlurmReport
    firewall: FirewallReport
    memory_bandwidth: MemoryBandwidth
    sensors: NodeSensors
    training_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, time: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., cpu_percent: _Optional[float] = ..., load1: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ProcessGroupSample, _Mapping]]] = ..., shard_states: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., engines_installed: _Optional[_Iterable[str]] = ..., engines_installing: _Optional[_Iterable[str]] = ..., sampled_at: _Optional[float] = ..., disk_free_bytes: _Optional[int] = ..., health: _Optional[_Union[HealthReport, _Mapping]] = ..., slurm: _Optional[_Union[SlurmReport, _Mapping]] = ..., firewall: _Optional[_Union[FirewallReport, _Mapping]] = ..., memory_bandwidth: _Optional[_Union[MemoryBandwidth, _Mapping]] = ..., sensors: _Optional[_Union[NodeSensors, _Mapping]] = ..., training_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class SensorValue(_message.Message):
    __slots__ = ("sensor", "label", "value")
    SENSOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    sensor: str
    label: str
    value: float
    def __init__(self, sensor: _Optional[str] = ..., label: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class NodeSensors(_message.Message):
    __slots__ = ("cpu_package_celsius", "cpu_package_watts", "inlet_celsius")
    CPU_PACKAGE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    CPU_PACKAGE_WATTS_FIELD_NUMBER: _ClassVar[int]
    INLET_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    cpu_package_celsius: _containers.RepeatedCompositeFieldContainer[SensorValue]
    cpu_package_watts: _containers.RepeatedCompositeFieldContainer[SensorValue]
    inlet_celsius: SensorValue
    def __init__(self, cpu_package_celsius: _Optional[_Iterable[_Union[SensorValue, _Mapping]]] = ..., cpu_package_watts: _Optional[_Iterable[_Union[SensorValue, _Mapping]]] = ..., inlet_celsius: _Optional[_Union[SensorValue, _Mapping]] = ...) -> None: ...

class MemoryBandwidth(_message.Message):
    __slots__ = ("one_core_bytes_per_second", "all_cores_bytes_per_second", "threads", "seconds")
    ONE_CORE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ALL_CORES_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    one_core_bytes_per_second: float
    all_cores_bytes_per_second: float
    threads: int
    seconds: float
    def __init__(self, one_core_bytes_per_second: _Optional[float] = ..., all_cores_bytes_per_second: _Optional[float] = ..., threads: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class FirewallReport(_message.Message):
    __slots__ = ("digest", "error", "rolled_back")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    digest: str
    error: str
    rolled_back: str
    def __init__(self, digest: _Optional[str] = ..., error: _Optional[str] = ..., rolled_back: _Optional[str] = ...) -> None: ...

class HealthFinding(_message.Message):
    __slots__ = ("level", "code", "message", "source", "blocks_placement")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    level: str
    code: str
    message: str
    source: str
    blocks_placement: bool
    def __init__(self, level: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., source: _Optional[str] = ..., blocks_placement: _Optional[bool] = ...) -> None: ...

class HealthCard(_message.Message):
    __slots__ = ("index", "uuid", "pci_bus_id", "findings")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    pci_bus_id: str
    findings: _containers.RepeatedCompositeFieldContainer[HealthFinding]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., findings: _Optional[_Iterable[_Union[HealthFinding, _Mapping]]] = ...) -> None: ...

class HealthIbPort(_message.Message):
    __slots__ = ("adapter", "port", "state", "physical_state", "rate_gbps", "link_layer", "fabric", "leaf")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    adapter: str
    port: int
    state: str
    physical_state: str
    rate_gbps: float
    link_layer: str
    fabric: str
    leaf: str
    def __init__(self, adapter: _Optional[str] = ..., port: _Optional[int] = ..., state: _Optional[str] = ..., physical_state: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., link_layer: _Optional[str] = ..., fabric: _Optional[str] = ..., leaf: _Optional[str] = ...) -> None: ...

class HealthReport(_message.Message):
    __slots__ = ("read_at", "source", "cards", "unattributed", "nvlink_domain", "nvlink_domain_reason", "nvlink_clique_ids", "imex", "ib_ports", "notes")
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CARDS_FIELD_NUMBER: _ClassVar[int]
    UNATTRIBUTED_FIELD_NUMBER: _ClassVar[int]
    NVLINK_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    NVLINK_DOMAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    NVLINK_CLIQUE_IDS_FIELD_NUMBER: _ClassVar[int]
    IMEX_FIELD_NUMBER: _ClassVar[int]
    IB_PORTS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    read_at: float
    source: str
    cards: _containers.RepeatedCompositeFieldContainer[HealthCard]
    unattributed: _containers.RepeatedCompositeFieldContainer[HealthFinding]
    nvlink_domain: str
    nvlink_domain_reason: str
    nvlink_clique_ids: _containers.RepeatedScalarFieldContainer[str]
    imex: bool
    ib_ports: _containers.RepeatedCompositeFieldContainer[HealthIbPort]
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, read_at: _Optional[float] = ..., source: _Optional[str] = ..., cards: _Optional[_Iterable[_Union[HealthCard, _Mapping]]] = ..., unattributed: _Optional[_Iterable[_Union[HealthFinding, _Mapping]]] = ..., nvlink_domain: _Optional[str] = ..., nvlink_domain_reason: _Optional[str] = ..., nvlink_clique_ids: _Optional[_Iterable[str]] = ..., imex: _Optional[bool] = ..., ib_ports: _Optional[_Iterable[_Union[HealthIbPort, _Mapping]]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard_id", "replica_id", "model", "state", "fingerprint", "settings_commit", "devices", "cpu_cores", "memory_bytes", "port", "error", "restarts", "pid", "last_log_lines", "adopted", "foreign", "progress", "progress_text", "rank", "group")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_COMMIT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_LINES_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TEXT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    replica_id: str
    model: str
    state: str
    fingerprint: str
    settings_commit: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    cpu_cores: float
    memory_bytes: int
    port: int
    error: str
    restarts: int
    pid: int
    last_log_lines: _containers.RepeatedScalarFieldContainer[str]
    adopted: bool
    foreign: bool
    progress: float
    progress_text: str
    rank: int
    group: str
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[str] = ..., fingerprint: _Optional[str] = ..., settings_commit: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., cpu_cores: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., port: _Optional[int] = ..., error: _Optional[str] = ..., restarts: _Optional[int] = ..., pid: _Optional[int] = ..., last_log_lines: _Optional[_Iterable[str]] = ..., adopted: _Optional[bool] = ..., foreign: _Optional[bool] = ..., progress: _Optional[float] = ..., progress_text: _Optional[str] = ..., rank: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class EngineStatus(_message.Message):
    __slots__ = ("engine", "state", "error", "progress", "progress_text")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TEXT_FIELD_NUMBER: _ClassVar[int]
    engine: str
    state: str
    error: str
    progress: float
    progress_text: str
    def __init__(self, engine: _Optional[str] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., progress: _Optional[float] = ..., progress_text: _Optional[str] = ...) -> None: ...

class KvBlocks(_message.Message):
    __slots__ = ("shard_id", "replica_id", "full", "stored", "removed", "block_size", "hash_algorithm", "hash_seed")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    HASH_SEED_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    replica_id: str
    full: bool
    stored: _containers.RepeatedScalarFieldContainer[int]
    removed: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    hash_algorithm: str
    hash_seed: str
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., full: _Optional[bool] = ..., stored: _Optional[_Iterable[int]] = ..., removed: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., hash_algorithm: _Optional[str] = ..., hash_seed: _Optional[str] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("request_id", "shard_id", "lines")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    shard_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., shard_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "error", "report")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ok: bool
    error: str
    report: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, command_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., report: _Optional[_Iterable[str]] = ...) -> None: ...

class WeightsFile(_message.Message):
    __slots__ = ("source", "sha256", "secret_value")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SECRET_VALUE_FIELD_NUMBER: _ClassVar[int]
    source: str
    sha256: str
    secret_value: str
    def __init__(self, source: _Optional[str] = ..., sha256: _Optional[str] = ..., secret_value: _Optional[str] = ...) -> None: ...

class StartShard(_message.Message):
    __slots__ = ("shard_id", "replica_id", "model", "engine", "engine_version", "weights", "devices", "cpu_cores", "memory_bytes", "context_size", "engine_args", "replica_key", "fingerprint", "settings_commit", "tensor_parallel", "pipeline_parallel", "allow_pickle", "served_name", "rank", "nodes", "group", "rendezvous", "env", "traceparent", "adapters")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ARGS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_KEY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_COMMIT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PICKLE_FIELD_NUMBER: _ClassVar[int]
    SERVED_NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    replica_id: str
    model: str
    engine: str
    engine_version: str
    weights: _containers.RepeatedCompositeFieldContainer[WeightsFile]
    devices: _containers.RepeatedScalarFieldContainer[str]
    cpu_cores: float
    memory_bytes: int
    context_size: int
    engine_args: _containers.RepeatedScalarFieldContainer[str]
    replica_key: str
    fingerprint: str
    settings_commit: str
    tensor_parallel: int
    pipeline_parallel: int
    allow_pickle: bool
    served_name: str
    rank: int
    nodes: int
    group: str
    rendezvous: str
    env: _containers.ScalarMap[str, str]
    traceparent: str
    adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., engine_version: _Optional[str] = ..., weights: _Optional[_Iterable[_Union[WeightsFile, _Mapping]]] = ..., devices: _Optional[_Iterable[str]] = ..., cpu_cores: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., context_size: _Optional[int] = ..., engine_args: _Optional[_Iterable[str]] = ..., replica_key: _Optional[str] = ..., fingerprint: _Optional[str] = ..., settings_commit: _Optional[str] = ..., tensor_parallel: _Optional[int] = ..., pipeline_parallel: _Optional[int] = ..., allow_pickle: _Optional[bool] = ..., served_name: _Optional[str] = ..., rank: _Optional[int] = ..., nodes: _Optional[int] = ..., group: _Optional[str] = ..., rendezvous: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., traceparent: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "weights")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    weights: _containers.RepeatedCompositeFieldContainer[WeightsFile]
    def __init__(self, name: _Optional[str] = ..., weights: _Optional[_Iterable[_Union[WeightsFile, _Mapping]]] = ...) -> None: ...

class StopShard(_message.Message):
    __slots__ = ("shard_id", "grace_seconds", "drain_seconds")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    grace_seconds: float
    drain_seconds: float
    def __init__(self, shard_id: _Optional[str] = ..., grace_seconds: _Optional[float] = ..., drain_seconds: _Optional[float] = ...) -> None: ...

class InstallEngine(_message.Message):
    __slots__ = ("engine", "version", "archive_url", "archive_sha256", "sdist_package", "sdist_version", "sdist_sha256", "mirror", "build_args", "python_packages", "traceparent")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_URL_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SDIST_PACKAGE_FIELD_NUMBER: _ClassVar[int]
    SDIST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SDIST_SHA256_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    BUILD_ARGS_FIELD_NUMBER: _ClassVar[int]
    PYTHON_PACKAGES_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    engine: str
    version: str
    archive_url: str
    archive_sha256: str
    sdist_package: str
    sdist_version: str
    sdist_sha256: str
    mirror: str
    build_args: _containers.RepeatedScalarFieldContainer[str]
    python_packages: _containers.RepeatedScalarFieldContainer[str]
    traceparent: str
    def __init__(self, engine: _Optional[str] = ..., version: _Optional[str] = ..., archive_url: _Optional[str] = ..., archive_sha256: _Optional[str] = ..., sdist_package: _Optional[str] = ..., sdist_version: _Optional[str] = ..., sdist_sha256: _Optional[str] = ..., mirror: _Optional[str] = ..., build_args: _Optional[_Iterable[str]] = ..., python_packages: _Optional[_Iterable[str]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class AgentSettings(_message.Message):
    __slots__ = ("weights_dir", "engines_dir", "heartbeat_interval", "telemetry_interval", "labels", "ignore_gpus", "mirrors", "shard_stop_grace", "offline", "fingerprint", "control_planes", "slurm", "tracing", "build", "firewall", "certificate_renew_fraction")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WEIGHTS_DIR_FIELD_NUMBER: _ClassVar[int]
    ENGINES_DIR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_GPUS_FIELD_NUMBER: _ClassVar[int]
    MIRRORS_FIELD_NUMBER: _ClassVar[int]
    SHARD_STOP_GRACE_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANES_FIELD_NUMBER: _ClassVar[int]
    SLURM_FIELD_NUMBER: _ClassVar[int]
    TRACING_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    FIREWALL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_RENEW_FRACTION_FIELD_NUMBER: _ClassVar[int]
    weights_dir: str
    engines_dir: str
    heartbeat_interval: float
    telemetry_interval: float
    labels: _containers.ScalarMap[str, str]
    ignore_gpus: _containers.RepeatedScalarFieldContainer[str]
    mirrors: _containers.RepeatedScalarFieldContainer[str]
    shard_stop_grace: float
    offline: bool
    fingerprint: str
    control_planes: _containers.RepeatedScalarFieldContainer[str]
    slurm: SlurmRole
    tracing: TraceSettings
    build: str
    firewall: FirewallTable
    certificate_renew_fraction: float
    def __init__(self, weights_dir: _Optional[str] = ..., engines_dir: _Optional[str] = ..., heartbeat_interval: _Optional[float] = ..., telemetry_interval: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., ignore_gpus: _Optional[_Iterable[str]] = ..., mirrors: _Optional[_Iterable[str]] = ..., shard_stop_grace: _Optional[float] = ..., offline: _Optional[bool] = ..., fingerprint: _Optional[str] = ..., control_planes: _Optional[_Iterable[str]] = ..., slurm: _Optional[_Union[SlurmRole, _Mapping]] = ..., tracing: _Optional[_Union[TraceSettings, _Mapping]] = ..., build: _Optional[str] = ..., firewall: _Optional[_Union[FirewallTable, _Mapping]] = ..., certificate_renew_fraction: _Optional[float] = ...) -> None: ...

class FirewallTable(_message.Message):
    __slots__ = ("text", "digest", "rollback_after")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_AFTER_FIELD_NUMBER: _ClassVar[int]
    text: str
    digest: str
    rollback_after: float
    def __init__(self, text: _Optional[str] = ..., digest: _Optional[str] = ..., rollback_after: _Optional[float] = ...) -> None: ...

class TraceSettings(_message.Message):
    __slots__ = ("endpoint", "sample_ratio")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATIO_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    sample_ratio: float
    def __init__(self, endpoint: _Optional[str] = ..., sample_ratio: _Optional[float] = ...) -> None: ...

class SlurmRole(_message.Message):
    __slots__ = ("daemons", "node_name", "lent", "drain_reason", "slurm_conf", "gres_conf", "slurmdbd_conf", "munge_key", "storage_host", "storage_port", "storage_user", "storage_password", "storage_database", "slurmctld_port", "slurmdbd_port", "cluster_name", "accounts", "users", "shared_path", "finished_since", "containers", "nfs_clients", "nfs_server")
    DAEMONS_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    LENT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    SLURM_CONF_FIELD_NUMBER: _ClassVar[int]
    GRES_CONF_FIELD_NUMBER: _ClassVar[int]
    SLURMDBD_CONF_FIELD_NUMBER: _ClassVar[int]
    MUNGE_KEY_FIELD_NUMBER: _ClassVar[int]
    STORAGE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORAGE_PORT_FIELD_NUMBER: _ClassVar[int]
    STORAGE_USER_FIELD_NUMBER: _ClassVar[int]
    STORAGE_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    STORAGE_DATABASE_FIELD_NUMBER: _ClassVar[int]
    SLURMCTLD_PORT_FIELD_NUMBER: _ClassVar[int]
    SLURMDBD_PORT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    SHARED_PATH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_SINCE_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    NFS_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    NFS_SERVER_FIELD_NUMBER: _ClassVar[int]
    daemons: _containers.RepeatedScalarFieldContainer[str]
    node_name: str
    lent: bool
    drain_reason: str
    slurm_conf: str
    gres_conf: str
    slurmdbd_conf: str
    munge_key: bytes
    storage_host: str
    storage_port: int
    storage_user: str
    storage_password: str
    storage_database: str
    slurmctld_port: int
    slurmdbd_port: int
    cluster_name: str
    accounts: _containers.RepeatedCompositeFieldContainer[SlurmAccountWanted]
    users: _containers.RepeatedCompositeFieldContainer[SlurmUser]
    shared_path: str
    finished_since: float
    containers: str
    nfs_clients: _containers.RepeatedScalarFieldContainer[str]
    nfs_server: str
    def __init__(self, daemons: _Optional[_Iterable[str]] = ..., node_name: _Optional[str] = ..., lent: _Optional[bool] = ..., drain_reason: _Optional[str] = ..., slurm_conf: _Optional[str] = ..., gres_conf: _Optional[str] = ..., slurmdbd_conf: _Optional[str] = ..., munge_key: _Optional[bytes] = ..., storage_host: _Optional[str] = ..., storage_port: _Optional[int] = ..., storage_user: _Optional[str] = ..., storage_password: _Optional[str] = ..., storage_database: _Optional[str] = ..., slurmctld_port: _Optional[int] = ..., slurmdbd_port: _Optional[int] = ..., cluster_name: _Optional[str] = ..., accounts: _Optional[_Iterable[_Union[SlurmAccountWanted, _Mapping]]] = ..., users: _Optional[_Iterable[_Union[SlurmUser, _Mapping]]] = ..., shared_path: _Optional[str] = ..., finished_since: _Optional[float] = ..., containers: _Optional[str] = ..., nfs_clients: _Optional[_Iterable[str]] = ..., nfs_server: _Optional[str] = ...) -> None: ...

class SlurmUser(_message.Message):
    __slots__ = ("login", "uid", "email", "home", "shell", "keys")
    LOGIN_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    login: str
    uid: int
    email: str
    home: str
    shell: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, login: _Optional[str] = ..., uid: _Optional[int] = ..., email: _Optional[str] = ..., home: _Optional[str] = ..., shell: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class SlurmAccountWanted(_message.Message):
    __slots__ = ("name", "parent", "description", "organisation", "users")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ORGANISATION_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    description: str
    organisation: str
    users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., description: _Optional[str] = ..., organisation: _Optional[str] = ..., users: _Optional[_Iterable[str]] = ...) -> None: ...

class SlurmDaemon(_message.Message):
    __slots__ = ("name", "state", "pid", "restarts", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    pid: int
    restarts: int
    error: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class SlurmReport(_message.Message):
    __slots__ = ("daemons", "version", "node_state", "node_reason", "job_steps", "lent", "warnings", "finished_jobs", "cluster_name", "finished_until", "users")
    DAEMONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_STEPS_FIELD_NUMBER: _ClassVar[int]
    LENT_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_JOBS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    daemons: _containers.RepeatedCompositeFieldContainer[SlurmDaemon]
    version: str
    node_state: str
    node_reason: str
    job_steps: int
    lent: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    finished_jobs: _containers.RepeatedCompositeFieldContainer[SlurmJob]
    cluster_name: str
    finished_until: float
    users: int
    def __init__(self, daemons: _Optional[_Iterable[_Union[SlurmDaemon, _Mapping]]] = ..., version: _Optional[str] = ..., node_state: _Optional[str] = ..., node_reason: _Optional[str] = ..., job_steps: _Optional[int] = ..., lent: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ..., finished_jobs: _Optional[_Iterable[_Union[SlurmJob, _Mapping]]] = ..., cluster_name: _Optional[str] = ..., finished_until: _Optional[float] = ..., users: _Optional[int] = ...) -> None: ...

class SlurmJob(_message.Message):
    __slots__ = ("job_id", "partition", "account", "user", "state", "elapsed_seconds", "cpus", "gpus", "gpu_type", "end_time")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    partition: str
    account: str
    user: str
    state: str
    elapsed_seconds: float
    cpus: int
    gpus: int
    gpu_type: str
    end_time: float
    def __init__(self, job_id: _Optional[str] = ..., partition: _Optional[str] = ..., account: _Optional[str] = ..., user: _Optional[str] = ..., state: _Optional[str] = ..., elapsed_seconds: _Optional[float] = ..., cpus: _Optional[int] = ..., gpus: _Optional[int] = ..., gpu_type: _Optional[str] = ..., end_time: _Optional[float] = ...) -> None: ...

class RequestLogs(_message.Message):
    __slots__ = ("request_id", "shard_id", "lines")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    shard_id: str
    lines: int
    def __init__(self, request_id: _Optional[str] = ..., shard_id: _Optional[str] = ..., lines: _Optional[int] = ...) -> None: ...

class Restart(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpgradeAgent(_message.Message):
    __slots__ = ("version", "offset", "data", "total_bytes", "sha256", "last", "trusted_keys", "confirm_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    offset: int
    data: bytes
    total_bytes: int
    sha256: str
    last: bool
    trusted_keys: _containers.RepeatedScalarFieldContainer[str]
    confirm_seconds: float
    def __init__(self, version: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., last: _Optional[bool] = ..., trusted_keys: _Optional[_Iterable[str]] = ..., confirm_seconds: _Optional[float] = ...) -> None: ...

class WipeNode(_message.Message):
    __slots__ = ("keep_weights",)
    KEEP_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    keep_weights: bool
    def __init__(self, keep_weights: _Optional[bool] = ...) -> None: ...

class FabricTest(_message.Message):
    __slots__ = ("request_id", "adapter", "port", "server", "timeout_seconds", "client")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    adapter: str
    port: int
    server: str
    timeout_seconds: float
    client: str
    def __init__(self, request_id: _Optional[str] = ..., adapter: _Optional[str] = ..., port: _Optional[int] = ..., server: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., client: _Optional[str] = ...) -> None: ...

class FabricTestOutput(_message.Message):
    __slots__ = ("request_id", "adapter", "output", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    adapter: str
    output: str
    error: str
    def __init__(self, request_id: _Optional[str] = ..., adapter: _Optional[str] = ..., output: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class RenewCertificate(_message.Message):
    __slots__ = ("csr_pem", "node_secret")
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_SECRET_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    node_secret: str
    def __init__(self, csr_pem: _Optional[bytes] = ..., node_secret: _Optional[str] = ...) -> None: ...

class CertificateRenewed(_message.Message):
    __slots__ = ("certificate_pem", "error")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    error: str
    def __init__(self, certificate_pem: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class TrustCertificates(_message.Message):
    __slots__ = ("ca_pem", "signing_ca_pem")
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SIGNING_CA_PEM_FIELD_NUMBER: _ClassVar[int]
    ca_pem: bytes
    signing_ca_pem: bytes
    def __init__(self, ca_pem: _Optional[bytes] = ..., signing_ca_pem: _Optional[bytes] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("node_id", "control_plane_version", "refusal")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    control_plane_version: str
    refusal: str
    def __init__(self, node_id: _Optional[str] = ..., control_plane_version: _Optional[str] = ..., refusal: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("protocol", "token", "node_id", "csr_pem")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    token: str
    node_id: str
    csr_pem: bytes
    def __init__(self, protocol: _Optional[int] = ..., token: _Optional[str] = ..., node_id: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("protocol", "certificate_pem", "ca_pem", "error")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    certificate_pem: bytes
    ca_pem: bytes
    error: str
    def __init__(self, protocol: _Optional[int] = ..., certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class StartTraining(_message.Message):
    __slots__ = ("job_id", "spec_json", "llama_cpp")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    LLAMA_CPP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec_json: str
    llama_cpp: str
    def __init__(self, job_id: _Optional[str] = ..., spec_json: _Optional[str] = ..., llama_cpp: _Optional[str] = ...) -> None: ...

class CancelTraining(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TrainingReport(_message.Message):
    __slots__ = ("job_id", "state", "step", "steps", "loss", "peak_memory_bytes", "seconds", "error", "losses")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    step: int
    steps: int
    loss: float
    peak_memory_bytes: int
    seconds: float
    error: str
    losses: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ..., step: _Optional[int] = ..., steps: _Optional[int] = ..., loss: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ..., losses: _Optional[_Iterable[float]] = ...) -> None: ...

class TrainingPiece(_message.Message):
    __slots__ = ("job_id", "name", "index", "count", "data", "size", "sha256")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    index: int
    count: int
    data: bytes
    size: int
    sha256: str
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., data: _Optional[bytes] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...
