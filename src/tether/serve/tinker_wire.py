"""The Tinker SDK's wire formats, decoded into plain arrays and encoded back (`tether.serve.tinker`).

The SDK (tinker 0.38) sends `forward_backward` (and `forward`, with `forward_only`) as a protobuf
`ForwardBackwardRequest` and reads `ForwardBackwardOutput` and `SampleResponse` back only as
protobuf (`Accept: application/x-protobuf`); every other call is JSON. The message classes are the
SDK's own generated ones (`tinker.proto.tinker_public_pb2`), so the server reads exactly what the
client writes. Layouts, as the SDK's `proto/request_conv.py` and `proto/response_conv.py` define
them: token ids are little-endian int32 bytes, log-probs float32 bytes, a `Tensor` is dense bytes or
sparse CSR (values, int64 row pointers, int64 column indices; unlisted cells are 0), and an output
field is one `BatchedTensor` for all datums (their flat arrays concatenated, int64 byte offsets).

Only text is served: an image or audio chunk is refused (`WireError`, a user error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


class WireError(ValueError):
    """A request tether cannot serve as sent (the client's input): reported as a user error."""


def _pb():
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError:  # pragma: no cover - the server refuses to start without it
        raise ImportError("the Tinker-compatible service needs the tinker package (its wire schema): "
                          "pip install 'tether[tinker]'") from None
    return tinker_public_pb2


@dataclass(frozen=True)
class Datum:
    """One training example: the input tokens and its `loss_fn_inputs` as numpy arrays."""

    tokens: tuple[int, ...]
    inputs: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class ForwardBackwardCall:
    model_id: str
    seq_id: int | None
    loss_fn: str
    config: Mapping[str, float | str]
    forward_only: bool
    data: tuple[Datum, ...]


_NP = {"float32": np.float32, "int64": np.int64}


def _proto_tensor(t: Any) -> np.ndarray:
    pb = _pb()
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}.get(t.dtype)
    if dtype is None:
        raise WireError(f"a loss_fn_inputs tensor has dtype {t.dtype}; only float32 and int64 are accepted")
    shape = list(t.shape)
    if t.WhichOneof("encoding") == "sparse_csr":
        csr = t.sparse_csr
        return _densify(np.frombuffer(csr.values, dtype=dtype), np.frombuffer(csr.crow_indices, dtype=np.int64),
                        np.frombuffer(csr.col_indices, dtype=np.int64), shape, dtype)
    arr = np.frombuffer(t.dense, dtype=dtype).copy()
    return arr.reshape(shape) if shape else arr


def _densify(values: np.ndarray, crow: np.ndarray, col: np.ndarray, shape: Sequence[int], dtype) -> np.ndarray:
    if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
        raise WireError(f"a sparse tensor's CSR indices do not match its shape {list(shape)}")
    out = np.zeros(shape, dtype=dtype)
    rows = np.repeat(np.arange(shape[0]), np.diff(crow))
    out[rows, col] = values
    return out


def tensor_from_json(td: Mapping[str, Any]) -> np.ndarray:
    """A JSON `TensorData` ({data, dtype, shape, sparse_crow_indices, sparse_col_indices})."""
    dtype = _NP.get(td.get("dtype", "float32"))
    if dtype is None:
        raise WireError(f"tensor dtype {td.get('dtype')!r}: only float32 and int64 are accepted")
    data = np.asarray(td.get("data", []), dtype=dtype)
    shape = td.get("shape")
    if td.get("sparse_crow_indices") is not None:
        return _densify(data, np.asarray(td["sparse_crow_indices"], dtype=np.int64),
                        np.asarray(td.get("sparse_col_indices") or [], dtype=np.int64), shape or [], dtype)
    return data.reshape(shape) if shape else data


def _chunk_tokens(kind: str | None, tokens: Sequence[int]) -> list[int]:
    if kind != "encoded_text":
        raise WireError(f"model input chunk {kind!r}: tether serves text models only (encoded_text chunks)")
    return list(tokens)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """A protobuf `ForwardBackwardRequest` (the SDK's forward_backward and forward calls)."""
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as err:  # protobuf's DecodeError: not a request this SDK wrote
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest ({err})") from None
    data = []
    for d in msg.data:
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            raw = np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32) if kind == "encoded_text" else ()
            tokens += _chunk_tokens(kind, [int(t) for t in raw])
        data.append(Datum(tuple(tokens), {k: _proto_tensor(v) for k, v in d.loss_fn_inputs.items()}))
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():  # v2 wins where both are set (the SDK writes both)
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    return ForwardBackwardCall(msg.model_id, msg.seq_id or None, msg.loss_fn, config, bool(msg.forward_only),
                               tuple(data))


def model_input_tokens(model_input: Mapping[str, Any]) -> list[int]:
    """The token ids of a JSON `ModelInput` ({chunks: [{type: encoded_text, tokens: [...]}, ...]})."""
    tokens: list[int] = []
    for chunk in model_input.get("chunks", []):
        tokens += _chunk_tokens(chunk.get("type", "encoded_text"), chunk.get("tokens", []))
    return tokens


def encode_forward_backward_output(outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float]) -> bytes:
    """A protobuf `ForwardBackwardOutput`: one `ArrayRecord` holding every datum's output fields."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    if outputs:
        record = msg.loss_fn_outputs.add()
        record.num_datums = len(outputs)
        for name in outputs[0]:
            arrays = [np.ascontiguousarray(o[name], dtype=np.float32).ravel() for o in outputs]
            offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([a.nbytes for a in arrays])
            bt = record.fields[name]
            bt.data = b"".join(a.tobytes() for a in arrays)
            bt.offsets = offsets.tobytes()
            bt.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


@dataclass(frozen=True)
class SampledSequence:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop: bool  # True: a stop token or sequence ended it; False: max_tokens


def encode_sample_response(sequences: Sequence[SampledSequence], prompt_logprobs: Sequence[float] | None) -> bytes:
    """A protobuf `SampleResponse` (prompt log-probs NaN where not computed, as the SDK reads None)."""
    pb = _pb()
    msg = pb.SampleResponse()
    for s in sequences:
        msg.sequences.append(pb.SampledSequence(
            stop_reason=pb.STOP_REASON_STOP if s.stop else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes()))
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
