"""The host agent: registration, heartbeats, artifact fetch, process spawn and supervision.

The building blocks, each usable on its own (the `tq executor` agent wires them together):

    _errors.py      ExecutorError and its subclasses
    _pack.py        deterministic packs of a file or directory, and safe unpacking
    _fetch.py       program sources (sha256:, file://, http(s)://) and bounded reads of them
    _artifacts.py   ArtifactCache (<data>/artifacts/<sha256>/) and the async ArtifactFetcher
    _spawn.py       SpawnSpec, the TQ_* environment, work directories, launch()
    _launcher.py    the exec wrapper arming PR_SET_PDEATHSIG (a standalone script)
    _forkserver.py  ForkServer: forks query processes from a pre-imported zygote
    _zygote.py      the zygote's program (a standalone script)
    _lines.py       LineSplitter: bounded line splitting
    _process_groups.py  signalling and emptying a POSIX process group
    _supervisor.py  Supervisor: pumps output to a sink, reports exits, kills
    _logs.py        LogForwarder: the sink that publishes lines to the __logs topic
    _metrics.py     host resources and load for registration and heartbeats (psutil)
    _slots.py       Slots: process slot accounting
    _host_broker.py HostBroker: one of the host's brokers with its endpoints, catalog view,
                    keyring, exit feed and remembered id and ports
    _shard.py       the host's other brokers, one process each (`--brokers N`)
    _join.py        a host that joined with a token: redeeming it, and what it keeps
    _ready_child.py a `tq executor` child that says when it is ready (tq up's, a shard)
    _agent_state.py AgentState: the agent's pure core (slots, sessions, the dying set, kills
                    during a spawn, which exits and failures to report)
    _agent.py       ExecutorAgent: the `tq executor` agent wiring all of the above to the
                    coordinator
"""

from executor._agent import ExecutorAgent
from executor._artifacts import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    Artifact,
    ArtifactCache,
    ArtifactFetcher,
    Uploader,
)
from executor._errors import (
    ArtifactError,
    ArtifactMissingError,
    DigestMismatchError,
    ExecFailedError,
    ExecutorError,
    ExecutorExitedError,
    FetchFailedError,
    FetchReason,
    InvalidArtifactError,
    NoFreeSlotsError,
    ProcessExistsError,
    UnknownProcessError,
)
from executor._fetch import Source, parse_source
from executor._lines import DEFAULT_MAX_LINE, LineSplitter
from executor._logs import LOGS_TOPIC, LogForwarder, line_of_record, record_of_line
from executor._metrics import (
    HostLoad,
    LoadSampler,
    ProcessLoad,
    executor_metrics,
    host_resources,
)
from executor._pack import pack_bytes, pack_path, sha256_hex, unpack
from executor._process_groups import live_members, signal_process_group, terminate_process_group
from executor._ready_child import exit_text, start_ready_child
from executor._slots import Slots
from executor._spawn import (
    Launched,
    SpawnSpec,
    launch,
    query_environment,
    resolve_entry,
)
from executor._supervisor import ExitReport, LogLine, LogSink, Running, Supervisor

__all__ = [
    "exit_text",
    "start_ready_child",
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "DEFAULT_MAX_LINE",
    "LOGS_TOPIC",
    "Artifact",
    "ArtifactCache",
    "ArtifactError",
    "ArtifactFetcher",
    "ArtifactMissingError",
    "DigestMismatchError",
    "ExecFailedError",
    "ExecutorAgent",
    "ExecutorError",
    "ExecutorExitedError",
    "ExitReport",
    "FetchFailedError",
    "FetchReason",
    "HostLoad",
    "InvalidArtifactError",
    "Launched",
    "LineSplitter",
    "LoadSampler",
    "LogForwarder",
    "LogLine",
    "LogSink",
    "NoFreeSlotsError",
    "ProcessExistsError",
    "ProcessLoad",
    "Running",
    "Slots",
    "Source",
    "SpawnSpec",
    "Supervisor",
    "Uploader",
    "UnknownProcessError",
    "executor_metrics",
    "host_resources",
    "launch",
    "line_of_record",
    "live_members",
    "pack_bytes",
    "pack_path",
    "parse_source",
    "query_environment",
    "record_of_line",
    "resolve_entry",
    "sha256_hex",
    "signal_process_group",
    "terminate_process_group",
    "unpack",
]
