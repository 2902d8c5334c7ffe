"""Messages between the API process and the engine process (`serve --engine-process`), msgpack over ZeroMQ.

As in vLLM V1: typed msgspec structs encoded with msgspec's msgpack codec, sent over two PUSH/PULL pairs the API
process binds (requests in, outputs back), one pair per engine process it starts.
"""

import msgspec

# The engine's process title: /proc/PID/cmdline shows it (longer than comm's 15 characters), as VLLM::EngineCore.
ENGINE_TITLE = "infersight::EngineCore"


class AddRequest(msgspec.Struct, tag="add"):
    id: str
    tokens: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    # CLOCK_MONOTONIC in the API process when the request arrived; the same clock in the engine on Linux.
    arrival: float


class Abort(msgspec.Struct, tag="abort"):
    id: str


class SetFault(msgspec.Struct, tag="fault"):
    seq: int
    name: str
    on: bool


class DebugQuery(msgspec.Struct, tag="debug"):
    seq: int


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


EngineInput = AddRequest | Abort | SetFault | DebugQuery | Shutdown

# (metric field of workload.metrics.ServerMetrics, label values, "observe" | "inc" | "set", value)
MetricOp = tuple[str, list[str], str, float]
# (request id, "token" | "done" | "error", token, detail): workload.scheduler.Event with its request's id.
OutputEvent = tuple[str, str, int, str]


class Ready(msgspec.Struct, tag="ready"):
    pid: int


class Outputs(msgspec.Struct, tag="outputs"):
    events: list[OutputEvent]
    # Metric updates the engine made since its last message, applied before the events are handed on, so a
    # client that has its answer also finds it counted in /metrics.
    metrics: list[MetricOp]


class Reply(msgspec.Struct, tag="reply"):
    seq: int
    error: str | None
    body: dict


EngineOutput = Ready | Outputs | Reply

encode = msgspec.msgpack.Encoder().encode
decode_input = msgspec.msgpack.Decoder(EngineInput).decode
decode_output = msgspec.msgpack.Decoder(EngineOutput).decode
