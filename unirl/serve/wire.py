"""The Tinker API's protobuf messages, read and written with the official SDK's own definitions
(``tinker.proto.tinker_public_pb2``, tinker 0.38.0): the ``forward_backward`` request, and the
``ForwardBackwardOutput`` / ``SampleResponse`` results ``retrieve_future`` returns.

Only this module imports the SDK (lazily: ``pip install 'unirl[serve]'``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the SDK versions the server is tested with (docs/tinker.md)
TESTED_SDK = ("0.38.0",)


def pb() -> Any:
    """The SDK's generated protobuf module; a UsageError when the SDK is not installed."""
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as exc:
        from unirl.errors import UsageError

        raise UsageError(f"unirl serve needs the Tinker SDK's wire definitions: pip install 'unirl[serve]' "
                         f"(tinker=={TESTED_SDK[-1]}); importing it failed: {exc}") from exc
    return tinker_public_pb2


@dataclass
class Datum:
    """One ``Datum`` of a ``forward_backward`` request: its input tokens and loss inputs (arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}


def _array(tensor: Any, where: str) -> np.ndarray:
    """A ``tinker_public.Tensor`` as a dense array (a sparse CSR one densified with 0, as the SDK pads)."""
    dtype = _DTYPES.get(int(tensor.dtype))
    if dtype is None:
        raise ValueError(f"{where}: tensor dtype {int(tensor.dtype)} is not one of float32, int64, int32")
    shape = tuple(int(s) for s in tensor.shape)
    if tensor.WhichOneof("encoding") == "sparse_csr":
        csr = tensor.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        rows, cols = np.frombuffer(csr.crow_indices, dtype=np.int64), np.frombuffer(csr.col_indices, dtype=np.int64)
        if len(shape) != 2:
            raise ValueError(f"{where}: a sparse tensor needs a 2-D shape, got {list(shape)}")
        dense = np.zeros(shape, dtype=dtype)
        for r in range(shape[0]):
            dense[r, cols[rows[r]:rows[r + 1]]] = values[rows[r]:rows[r + 1]]
        return dense
    flat = np.frombuffer(tensor.dense, dtype=dtype)
    if not shape:
        return flat.copy()
    if int(np.prod(shape)) != flat.size:
        raise ValueError(f"{where}: shape {list(shape)} does not hold the {flat.size} values sent")
    return flat.reshape(shape).copy()


def read_forward_backward(body: bytes) -> ForwardBackward:
    """A ``tinker_public.ForwardBackwardRequest``; a ValueError naming the datum and field for what
    cannot be read (images, audio, a malformed tensor)."""
    from google.protobuf.message import DecodeError

    msg = pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"the forward_backward body is not a tinker_public.ForwardBackwardRequest: {exc}") from None
    config: dict[str, float | str] = {k: (v.text if v.WhichOneof("value") == "text" else v.number)
                                      for k, v in msg.loss_fn_config_v2.items()} or dict(msg.loss_fn_config)
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise ValueError(f"data[{i}].model_input: a {kind} chunk; this server trains text models "
                                 f"(encoded_text chunks only)")
            tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
        data.append(Datum(tokens, {k: _array(t, f"data[{i}].loss_fn_inputs[{k!r}]")
                                   for k, t in datum.loss_fn_inputs.items()}))
    return ForwardBackward(model_id=msg.model_id, seq_id=int(msg.seq_id), loss_fn=msg.loss_fn, config=config,
                           forward_only=bool(msg.forward_only), data=data)


def forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ``ArrayRecord`` holding each datum's ``logprobs``
    (float32, the datum's target shape) and the metrics (``name:reduction``)."""
    out = pb().ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = out.loss_fn_outputs.add()
    record.num_datums = len(logprobs)
    arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in logprobs]
    offsets = np.cumsum([0, *(a.nbytes for a in arrays)]).astype(np.int64)
    record.fields["logprobs"].CopyFrom(pb().BatchedTensor(data=b"".join(a.tobytes() for a in arrays),
                                                          offsets=offsets.tobytes(), dtype=pb().DTYPE_FLOAT32))
    return bytes(out.SerializeToString())


def sample_response(sequences: list[tuple[list[int], list[float], bool]],
                    prompt_logprobs: list[float] | None = None) -> bytes:
    """A ``SampleResponse``: each sequence's tokens (int32), their log-probs (float32) and whether it
    stopped (``stop``) or ran out of tokens (``length``); with ``prompt_logprobs``, the prompt's
    (NaN at position 0, which has none)."""
    msg = pb()
    out = msg.SampleResponse()
    for tokens, logprobs, stopped in sequences:
        seq = out.sequences.add()
        seq.stop_reason = msg.STOP_REASON_STOP if stopped else msg.STOP_REASON_LENGTH
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray([np.nan, *prompt_logprobs], dtype=np.float32).tobytes()
    return bytes(out.SerializeToString())
