"""The protobuf side of the API, with the message definitions that ship in the SDK.

The SDK sends ``forward_backward`` (and ``forward``) requests as protobuf
(``Content-Type: application/x-protobuf``, zstd-compressed when the client config asks), and
asks for ``ForwardBackwardOutput`` and ``SampleResponse`` results as protobuf (``Accept:
application/x-protobuf``); everything else is JSON. ``decode_forward_backward`` reads a
request into plain arrays, refusing what it cannot read with a 400 naming the field;
``forward_backward_proto`` and ``sample_proto`` write the two results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# The SDK's generated messages: importing them here makes a missing tinker extra an
# ImportError when the service is imported, which the CLI turns into a one-line message.
from tinker.proto import tinker_public_pb2 as pb

from trinity.tinker.errors import TinkerError, bad_field

PROTOBUF = "application/x-protobuf"


@dataclass
class Datum:
    """One training example: the input tokens and the loss's input arrays by name."""

    tokens: List[int]
    inputs: Dict[str, np.ndarray]


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    config: Dict[str, object]  # loss_fn_config: numbers (and strings, which no loss here reads)
    forward_only: bool
    data: List[Datum]


def decode_forward_backward(body: bytes, encoding: str) -> ForwardBackwardRequest:
    """A ``ForwardBackwardRequest`` message (``encoding``: its Content-Encoding)."""
    if encoding == "zstd":
        import zstandard

        try:
            body = zstandard.ZstdDecompressor().decompress(body)
        except zstandard.ZstdError as exc:
            raise TinkerError(400, f"body: not zstd-compressed ({exc})") from None
    elif encoding not in ("", "identity"):
        raise bad_field("Content-Encoding", f"'{encoding}' is not supported (zstd or none)")
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise TinkerError(400, f"body: not a ForwardBackwardRequest message ({exc})") from None
    if not message.model_id:
        raise bad_field("model_id", "missing")
    config: Dict[str, object] = {key: value for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():  # v2 wins where both are set
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [_datum(d, f"data[{i}]") for i, d in enumerate(message.data)]
    return ForwardBackwardRequest(
        message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data
    )


def _datum(message, field: str) -> Datum:
    tokens: List[int] = []
    for j, chunk in enumerate(message.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise bad_field(
                f"{field}.model_input[{j}]",
                f"'{kind}' chunks are not supported by this server (text models: "
                "encoded_text chunks of token ids only)",
            )
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise bad_field(f"{field}.model_input[{j}].tokens", "not int32 values")
        tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
    inputs = {
        name: tensor(value, f"{field}.loss_fn_inputs.{name}")
        for name, value in message.loss_fn_inputs.items()
    }
    return Datum(tokens, inputs)


_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}  # DType: FLOAT32, INT64, INT32


def tensor(message, field: str) -> np.ndarray:
    """A ``Tensor`` message as an array of its shape (sparse CSR made dense, zeros where
    no value is listed)."""
    dtype = _DTYPES.get(message.dtype)
    if dtype is None:
        raise bad_field(f"{field}.dtype", f"{message.dtype} is not float32, int64 or int32")
    shape = [int(s) for s in message.shape]
    if any(s < 0 for s in shape):
        raise bad_field(f"{field}.shape", f"{shape} has a negative size")
    try:
        if message.WhichOneof("encoding") == "sparse_csr":
            return _dense(message.sparse_csr, dtype, shape, field)
        values = np.frombuffer(message.dense, dtype=dtype).copy()  # a writable array
        return values.reshape(shape if shape else [-1])
    except ValueError as exc:
        raise bad_field(field, f"values do not fit shape {shape} ({exc})") from None


def _dense(csr, dtype, shape: Sequence[int], field: str) -> np.ndarray:
    if len(shape) != 2:
        raise bad_field(f"{field}.shape", f"a sparse CSR tensor is 2-D, not {list(shape)}")
    values = np.frombuffer(csr.values, dtype=dtype)
    rows = np.frombuffer(csr.crow_indices, dtype=np.int64)
    cols = np.frombuffer(csr.col_indices, dtype=np.int64)
    ok = len(rows) == shape[0] + 1 and len(cols) == len(values) and rows[-1] == len(values)
    if not ok or (len(cols) and (cols.min() < 0 or cols.max() >= shape[1])):
        raise bad_field(f"{field}.sparse_csr", f"indices do not describe a {list(shape)} tensor")
    out = np.zeros(shape, dtype=dtype)
    row_of = np.repeat(np.arange(shape[0]), np.diff(rows))
    out[row_of, cols] = values
    return out


def forward_backward_proto(
    outputs: List[Dict[str, np.ndarray]], metrics: Dict[str, float]
) -> bytes:
    """A ``ForwardBackwardOutput`` message: each datum's output arrays (one ``ArrayRecord``
    per run of datums whose arrays have the same trailing shape) and the metrics."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    for run in _runs(outputs):
        record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(run))
        for name in run[0]:
            arrays = [np.ascontiguousarray(out[name], dtype=np.float32) for out in run]
            sizes = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
            batched = record.fields[name]
            batched.data = b"".join(a.tobytes() for a in arrays)
            batched.offsets = sizes.tobytes()
            batched.dtype = pb.DTYPE_FLOAT32
            batched.trailing_shape.extend(arrays[0].shape[1:])
    return message.SerializeToString()


def _runs(outputs: List[Dict[str, np.ndarray]]) -> List[List[Dict[str, np.ndarray]]]:
    """Consecutive datums whose outputs have the same names and trailing shapes."""
    runs: List[List[Dict[str, np.ndarray]]] = []
    for out in outputs:
        key = {name: a.shape[1:] for name, a in out.items()}
        if runs and {name: a.shape[1:] for name, a in runs[-1][0].items()} == key:
            runs[-1].append(out)
        else:
            runs.append([out])
    return runs


@dataclass
class Sampled:
    """One sampled sequence: its tokens, their logprobs, why it stopped, and the top
    alternatives at each step when asked."""

    tokens: List[int]
    logprobs: List[float]
    stop_reason: str  # "stop" | "length"
    topk: Optional[Tuple[np.ndarray, np.ndarray]] = None  # (ids, logprobs), (n, k) each


@dataclass
class SampleResult:
    sequences: List[Sampled]
    prompt_logprobs: Optional[np.ndarray] = None  # (prompt length,), NaN where not scored
    topk_prompt: Optional[Tuple[np.ndarray, np.ndarray]] = None


def sample_proto(result: SampleResult) -> bytes:
    """A ``SampleResponse`` message."""
    message = pb.SampleResponse()
    for seq in result.sequences:
        out = message.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
        )
        if seq.topk is not None:
            _topk(out.topk_sampled_logprobs, seq.topk)
    if result.prompt_logprobs is not None:
        message.prompt_logprobs = result.prompt_logprobs.astype(np.float32).tobytes()
    if result.topk_prompt is not None:
        _topk(message.topk_prompt_logprobs, result.topk_prompt)
    return message.SerializeToString()


def _topk(message, topk: Tuple[np.ndarray, np.ndarray]) -> None:
    ids, logprobs = topk
    message.token_ids = np.ascontiguousarray(ids, dtype=np.int32).tobytes()
    message.logprobs = np.ascontiguousarray(logprobs, dtype=np.float32).tobytes()
    message.length, message.k = int(ids.shape[0]), int(ids.shape[1])
