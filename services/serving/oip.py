"""The Open Inference Protocol v2 (REST) next to ``/v1``, so KServe/Triton/MLServer clients can
call our heads with the client they already have (docs/serving.md, "Open Inference Protocol").

One model per head; its one version is the served head version (older versions are not kept:
every delete makes a new one). Inputs are the head's input kind as one tensor (``features`` FP32
``[-1, d]``, ``text`` or ``image_png`` BYTES ``[-1]``); outputs are ``scores`` FP64 ``[-1, c]``
(NaN for classes without retained samples), ``predicted_class`` INT64 ``[-1]`` (-1: none) and
``variance`` FP64 ``[-1]`` (NaN: no posterior). FP64 so that the numbers are bit for bit those of
``/v1`` (JSON numbers are doubles). Both the JSON and the binary tensor data encodings are read
and written (tritonclient sends binary by default). Errors are ``{"error": "..."}``, as the
protocol says. Inputs go through the very ``prepare_inputs`` and scoring of ``/v1``.

This module registers routes on an app it is given the state of (:class:`OipState`): it does not
import ``http``, which imports it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from unlearn.common.registry import ContractSource, contract_at
from unlearn.infra.settings import HeadSettings, Settings
from unlearn.schemas.head_scores import score_rows
from unlearn.services.serving.predict import MAX_INPUTS, HeadStore, PredictError, ServedHead, prepare_inputs
from unlearn.services.serving.settings import ServeSettings

__all__ = ["BINARY_HEADER", "INPUT_NAMES", "OUTPUT_NAMES", "OipState", "add_oip_routes", "input_kind_of"]

#: The binary tensor data extension's header: the length of the JSON part of the body.
BINARY_HEADER = "Inference-Header-Content-Length"
#: The input tensor's name per input kind of a head (the kind /v1 names its body field after).
INPUT_NAMES = {"features": "features", "text": "text", "image": "image_png"}
#: The output tensors, in the order they are returned when the request names none.
OUTPUT_NAMES = ("scores", "predicted_class", "variance")
_NUMERIC: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "FP64": np.dtype("<f8")}
_OUT_TYPES = {"scores": "FP64", "predicted_class": "INT64", "variance": "FP64"}
_OUT_DTYPES: dict[str, np.dtype[Any]] = {"FP64": np.dtype("<f8"), "INT64": np.dtype("<i8")}


@dataclass(frozen=True)
class OipState:
    """What the OIP handlers read: the /v1 app's own store, settings, contracts and model pool."""

    settings: Settings
    store: HeadStore
    contracts: ContractSource
    pool: concurrent.futures.ThreadPoolExecutor
    ready: Callable[[], bool]


_STATE = web.AppKey("oip_state", OipState)


class OipError(Exception):
    """A refused OIP request: HTTP ``status`` and the message of its ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _err(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _no_query(request: web.Request) -> None:
    if request.query:
        raise OipError(400, f"unknown query parameter(s) {sorted(set(request.query))}: this route takes none")


def _package_version() -> str:
    try:
        return metadata.version("unlearn-stream")
    except metadata.PackageNotFoundError:  # a source tree without an install
        return "0"


def input_kind_of(settings: Settings, head: ServedHead, contracts: ContractSource) -> str:
    """The input kind a head takes: its contract's, else its configured backbone's, else features."""
    contract = contract_at(contracts, head.update.head_id, head.update.contract_version)
    if contract is not None:
        return contract.input_kind
    configured = HeadSettings.of(settings).backbone_for(head.update.head_id)
    if configured is None:
        return "features"
    from unlearn.features.backbones import backbone_info

    try:
        return str(backbone_info(configured).kind)
    except Exception:  # an unknown backbone: /v1 refuses its inputs too; features is what is left
        return "features"


def _served(request: web.Request) -> ServedHead:
    """The head the path names (ONE reference for the whole request), at the version it names."""
    head_id = request.match_info["head"]
    head = request.app[_STATE].store.get(head_id)
    if head is None:
        raise OipError(404, f"unknown model {head_id!r}: no head of that id has been published (yet)")
    want = request.match_info.get("version")
    if want is not None and want != str(head.update.version):
        raise OipError(404, f"model {head_id!r} version {want!r} is not served: only the latest head version "
                            f"is, now {head.update.version}")
    return head


def _handler(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            _no_query(request)
            resp: web.StreamResponse = await fn(request)
            return resp
        except OipError as exc:
            return _err(exc.status, exc.message)
        except PredictError as exc:
            return _err(exc.status, f"{exc.reason}: {exc.detail}")

    return wrapped


async def _server_metadata(request: web.Request) -> web.Response:
    return _json({"name": "unlearn-stream", "version": _package_version(), "extensions": ["binary_tensor_data"]})


async def _live(request: web.Request) -> web.Response:
    return _json({"live": True})


async def _ready(request: web.Request) -> web.Response:
    ready = request.app[_STATE].ready()
    return _json({"ready": ready}, 200 if ready else 503)


async def _model_metadata(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    head = _served(request)
    u = head.update
    kind = input_kind_of(state.settings, head, state.contracts)
    name = INPUT_NAMES.get(kind, "features")
    inp = ({"name": name, "datatype": "FP32", "shape": [-1, u.d]} if name == "features"
           else {"name": name, "datatype": "BYTES", "shape": [-1]})
    return _json({
        "name": u.head_id,
        "versions": [str(u.version)],
        "platform": "unlearn-ridge",
        "inputs": [inp],
        "outputs": [{"name": "scores", "datatype": "FP64", "shape": [-1, u.c]},
                    {"name": "predicted_class", "datatype": "INT64", "shape": [-1]},
                    {"name": "variance", "datatype": "FP64", "shape": [-1]}],
    })


async def _model_ready(request: web.Request) -> web.Response:
    head = _served(request)
    return _json({"name": head.update.head_id, "ready": True})


def _shape(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list) or not raw:
        raise OipError(400, f"{where}: shape must be a non-empty list of non-negative integers")
    dims = []
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise OipError(400, f"{where}: shape must be a list of non-negative integers, got {raw!r:.80}")
        if v < 0:
            raise OipError(400, f"{where}: shape dimensions must be >= 0, got {raw!r:.80}")
        dims.append(int(v))
    return dims


def _flatten(data: Any, where: str) -> list[Any]:
    """The row-major flattening of ``data`` (OIP allows nested or flat lists)."""
    if not isinstance(data, list):
        raise OipError(400, f"{where}: data must be a list")
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def _bytes_elements(chunk: bytes, where: str) -> list[bytes]:
    """The elements of a BYTES tensor's binary form: each a 4-byte little-endian length, then bytes."""
    out, i = [], 0
    while i < len(chunk):
        if i + 4 > len(chunk):
            raise OipError(400, f"{where}: truncated BYTES element length")
        (n,) = struct.unpack_from("<I", chunk, i)
        i += 4
        if i + n > len(chunk):
            raise OipError(400, f"{where}: BYTES element longer than the data")
        out.append(chunk[i:i + n])
        i += n
    return out


def _base64(items: list[str], where: str) -> list[bytes]:
    """PNG images in JSON: base64 strings, as /v1 takes them (raw bytes belong in binary data)."""
    try:
        return [base64.b64decode(v.encode("ascii"), validate=True) for v in items]
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise OipError(400, f"{where}: image_png in JSON data must be standard base64: {exc}") from None


def _json_values(inp: dict[str, Any], name: str, datatype: str, dims: list[int], where: str) -> list[Any]:
    """The rows (features) or elements (BYTES) of an input given as JSON ``data``."""
    if "data" not in inp:
        raise OipError(400, f"{where}: no data (neither data nor parameters.binary_data_size)")
    flat_list = _flatten(inp["data"], where)
    count = math.prod(dims)
    if len(flat_list) != count:
        raise OipError(400, f"{where}: shape {dims} holds {count} values, data has {len(flat_list)}")
    if name == "features":
        if not all(type(v) in (int, float) for v in flat_list):
            raise OipError(400, f"{where}: {datatype} data must be numbers")
        arr = np.asarray(flat_list, dtype=np.float64)
        if datatype == "FP32":  # the values the tensor holds, as a binary FP32 tensor would
            with np.errstate(over="ignore"):  # out of FP32 range: inf, refused as non-finite
                arr = arr.astype(np.float32).astype(np.float64)
        return list(arr.reshape(dims))
    if not all(isinstance(v, str) for v in flat_list):
        raise OipError(400, f"{where}: BYTES data must be strings")
    return [v.encode() for v in flat_list] if name == "text" else _base64(flat_list, where)


def _parse_input(inp: Any, tail: bytes, offset: int) -> tuple[str, list[Any], int]:
    """(name, items as /v1 takes them, new offset into the binary tail) of one request input."""
    if not isinstance(inp, dict):
        raise OipError(400, "each input must be an object")
    name, datatype = inp.get("name"), inp.get("datatype")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise OipError(400, "each input needs a string name and datatype")
    where = f"input {name!r:.40}"
    dims = _shape(inp.get("shape"), where)
    params = inp.get("parameters", {})
    if not isinstance(params, dict):
        raise OipError(400, f"{where}: parameters must be an object")
    if name not in INPUT_NAMES.values():
        raise OipError(400, f"{where}: unknown input; a head takes one of {sorted(INPUT_NAMES.values())}")
    want = ("FP32", "FP64") if name == "features" else ("BYTES",)
    if datatype not in want:
        raise OipError(400, f"{where}: datatype must be {' or '.join(want)}, got {datatype!r:.40}")
    if name == "features" and len(dims) != 2:
        raise OipError(400, f"{where}: shape must be [n, d], got {dims}")
    if name != "features" and not (len(dims) == 1 or (len(dims) == 2 and dims[1] == 1)):
        raise OipError(400, f"{where}: shape must be [n] or [n, 1], got {dims}")
    n = dims[0]
    if not 1 <= n <= MAX_INPUTS:
        raise OipError(400, f"{where}: between 1 and {MAX_INPUTS} inputs per request, got {n}")
    count = math.prod(dims)
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(tail):
            raise OipError(400, f"{where}: binary_data_size {size!r:.40} does not fit the binary data")
        chunk = tail[offset:offset + size]
        offset += size
        if name == "features":
            dt = _NUMERIC[datatype]
            if size != count * dt.itemsize:
                raise OipError(400, f"{where}: {size} bytes of binary data for {count} {datatype} values")
            flat = np.frombuffer(chunk, dtype=dt).astype(np.float64)
            values: list[Any] = list(flat.reshape(dims))
        else:
            values = _bytes_elements(chunk, where)
    else:
        values = _json_values(inp, name, datatype, dims, where)
    if len(values) != n:
        raise OipError(400, f"{where}: shape {dims} holds {n} elements, the data has {len(values)}")
    if name == "text":
        try:
            texts = [v.decode("utf-8") for v in values]
        except UnicodeDecodeError as exc:
            raise OipError(400, f"{where}: text is not UTF-8: {exc}") from None
        if not all(texts):
            raise OipError(400, f"{where}: every text must be non-empty")
        values = list(texts)
    return name, values, offset


def _requested_outputs(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """(output name, binary?) for each output to return, in the order asked."""
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise OipError(400, "parameters must be an object")
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise OipError(400, "parameters.binary_data_output must be a boolean")
    asked = body.get("outputs")
    if asked is None:
        return [(name, default_binary) for name in OUTPUT_NAMES]
    if not isinstance(asked, list):
        raise OipError(400, "outputs must be a list")
    out = []
    for o in asked:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise OipError(400, "each requested output must be an object with a string name")
        op = o.get("parameters", {})
        if not isinstance(op, dict):
            raise OipError(400, f"output {o['name']!r:.40}: parameters must be an object")
        if o["name"] not in OUTPUT_NAMES:
            raise OipError(400, f"unknown output {o['name']!r:.40}; the outputs are {list(OUTPUT_NAMES)}")
        binary = op.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise OipError(400, f"output {o['name']!r}: parameters.binary_data must be a boolean")
        out.append((o["name"], binary))
    return out


async def _read_body(request: web.Request) -> tuple[dict[str, Any], bytes]:
    """The JSON part of the body and the binary tail after it (binary tensor data extension)."""
    raw = await request.read()
    header_len = request.headers.get(BINARY_HEADER)
    if header_len is None:
        head, tail = raw, b""
    else:
        if not (header_len.isascii() and header_len.isdigit() and int(header_len) <= len(raw)):
            raise OipError(400, f"{BINARY_HEADER} must be an integer 0..{len(raw)}, got {header_len[:40]!r}")
        head, tail = raw[:int(header_len)], raw[int(header_len):]
    try:
        body = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise OipError(400, f"the inference request is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OipError(400, "the inference request must be a JSON object")
    return body, tail


def _encode(outputs: list[tuple[str, bool]], tensors: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], bytes]:
    """The response's output objects and the binary tail (NaN is null in JSON, as /v1 writes it)."""
    objs, tail = [], bytearray()
    for name, binary in outputs:
        arr = tensors[name]
        datatype = _OUT_TYPES[name]
        obj: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            data = np.ascontiguousarray(arr, dtype=_OUT_DTYPES[datatype]).tobytes()
            obj["parameters"] = {"binary_data_size": len(data)}
            tail += data
        elif datatype == "FP64":
            obj["data"] = [None if math.isnan(v) else v for v in arr.reshape(-1).tolist()]
        else:
            obj["data"] = arr.reshape(-1).tolist()
        objs.append(obj)
    return objs, bytes(tail)


async def _infer(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    head = _served(request)  # the ONE reference this request uses
    u = head.update
    body, tail = await _read_body(request)
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise OipError(400, "id must be a string")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        raise OipError(400, "inputs must be a list of exactly one tensor (features, text or image_png)")
    outputs = _requested_outputs(body)
    name, items, _ = _parse_input(inputs[0], tail, 0)
    kind = "image_png" if name == "image_png" else name
    contract = contract_at(state.contracts, u.head_id, u.contract_version)
    if kind == "features":
        X = prepare_inputs(state.settings, head, kind, items, contract)
    else:  # a model forward: off the event loop, on the one backbone thread of /v1
        X = await asyncio.get_running_loop().run_in_executor(state.pool, prepare_inputs, state.settings, head, kind,
                                                             items, contract)
    ranked = score_rows(u, X, 1)
    if head.posterior is not None:
        from unlearn.ledger.bayes import predictive_variance

        var = np.asarray(predictive_variance(X, head.posterior, ServeSettings.of(state.settings).serve_sigma2),
                         dtype=np.float64)
    else:
        var = np.full(X.shape[0], np.nan)
    tensors = {"scores": ranked.scores, "predicted_class": ranked.predicted, "variance": var}
    objs, binary = _encode(outputs, tensors)
    out: dict[str, Any] = {"model_name": u.head_id, "model_version": str(u.version), "outputs": objs}
    if rid is not None:
        out["id"] = rid
    header = orjson.dumps(out)
    if not binary:
        return web.Response(body=header, content_type="application/json")
    return web.Response(body=header + binary, content_type="application/octet-stream",
                        headers={BINARY_HEADER: str(len(header))})


def add_oip_routes(app: web.Application, state: OipState) -> None:
    """Register the OIP v2 routes on ``app``, answering from ``state``."""
    app[_STATE] = state
    get, post = app.router.add_get, app.router.add_post
    get("/v2", _handler(_server_metadata))
    get("/v2/health/live", _handler(_live))
    get("/v2/health/ready", _handler(_ready))
    for base in ("/v2/models/{head}", "/v2/models/{head}/versions/{version}"):
        get(base, _handler(_model_metadata))
        get(f"{base}/ready", _handler(_model_ready))
        post(f"{base}/infer", _handler(_infer))
