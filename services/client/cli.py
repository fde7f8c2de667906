"""``unlearn add | delete | delete-subject``: produce request events from the shell.

One request from arguments, or many from ``--file F.jsonl`` (one object per line, see
docs/client.md; a tqdm progress bar on stderr). Every line is validated before anything is
produced, so a bad file produces nothing. Without ``--wait`` each produced request is printed as
one JSON line (event id, partition, offset). With ``--wait`` (delete, delete-subject) the command
waits for each deletion's receipt and prints it as one JSON line.

Exit codes: 0 success (with --wait: every receipt "applied" or "tombstoned": a delete that
removed nothing, since nothing of it was in the head, and that keeps its older adds out);
1 error (bad input, broker, receipt timeout -- the message names the event id and head);
2 usage; 3 at least one receipt "rejected" (printed, with its reason).
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from unlearn.infra.cli_args import add_broker_args, cli_exit_code, settings_from_args, settings_help
from unlearn.infra.settings import ErasureSettings, Settings
from unlearn.schemas.envelope import REQUEST_SCHEMA_V1, Request, request_from_dict
from unlearn.schemas.receipts import receipt_to_dict
from unlearn.schemas.request_errors import InvalidRequest
from unlearn.services.client.settings import ClientSettings

if TYPE_CHECKING:  # the SDK (confluent-kafka) loads only when a request is produced
    from unlearn.services.client.sdk import RequestHandle, UnlearnClient

__all__ = ["EXIT_ERROR", "EXIT_REJECTED", "add_main", "delete_main", "delete_subject_main", "load_requests"]

EXIT_ERROR = 1
EXIT_REJECTED = 3

_OP_OF_COMMAND = {"add": "add", "delete": "delete", "delete-subject": "delete_subject"}
# Keys a JSONL line may carry: envelope fields plus the SDK's input shorthands.
_LINE_KEYS = frozenset({
    "schema", "event_id", "op", "head_id", "client_id", "subject_id", "sample_id", "label", "input", "ts",
    "features", "text", "image_png", "image_file",
})


class CliError(Exception):
    """A user-facing error (printed as ``error: ...``, exit 1)."""


def _parser(command: str) -> argparse.ArgumentParser:
    op = _OP_OF_COMMAND[command]
    ap = argparse.ArgumentParser(
        prog=f"unlearn {command}",
        description={
            "add": "Produce add requests (features, text or PNG image with a label).",
            "delete": "Produce delete requests for samples (optionally wait for their receipts).",
            "delete_subject": "Produce delete_subject requests (optionally wait for their receipts).",
        }[op],
        epilog="--file lines are JSON objects with envelope fields (head_id, subject_id, sample_id, label, "
               "input, event_id, client_id, ts) or the shorthands features / text / image_png (base64) / "
               "image_file; missing fields come from the options. See docs/client.md.",
    )
    add_broker_args(ap)
    settings_help(ap, ClientSettings, ErasureSettings)
    ap.add_argument("--head", help="head id (required unless every --file line has head_id)")
    ap.add_argument("--subject", help="subject id (the message key)")
    if op != "delete_subject":
        ap.add_argument("--sample", help="sample id")
    if op == "add":
        ap.add_argument("--label", help="class index (e.g. 3) or a JSON list of numbers (target vector)")
        src = ap.add_mutually_exclusive_group()
        src.add_argument("--features", help="feature vector: comma-separated numbers or a JSON list")
        src.add_argument("--text", help="text input (for a text backbone)")
        src.add_argument("--image", help="path of a PNG image (for an image backbone)")
    ap.add_argument("--client-id", help="client_id of the requests (default: UNLEARN_CLIENT_ID)")
    ap.add_argument("--key-file", help="sign with this Ed25519 PEM private key (default: UNLEARN_CLIENT_KEY_FILE)")
    ap.add_argument("--key-id", help="the key's id in the client registry (default: UNLEARN_CLIENT_KEY_ID, else "
                                     "its fingerprint)")
    ap.add_argument("--event-id", help="event id of a single request (default: a fresh UUID)")
    ap.add_argument("--file", help="JSONL file of requests (one object per line); '-' reads stdin")
    if op != "add":
        ap.add_argument("--wait", action="store_true", help="wait for each receipt and print it as JSON")
        ap.add_argument("--timeout", type=float,
                        help="seconds to wait for all receipts (default: UNLEARN_RECEIPT_TIMEOUT)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar, no per-request output lines")
    return ap


def _parse_label(text: str) -> Any:
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise CliError(f"--label {text!r} is neither an integer nor a JSON list of numbers") from None
    return v


def _parse_features(text: str) -> list[float]:
    t = text.strip()
    try:
        v = orjson.loads(t) if t.startswith("[") else [float(x) for x in t.split(",") if x.strip()]
    except (orjson.JSONDecodeError, ValueError):
        raise CliError("--features must be comma-separated numbers or a JSON list") from None
    if not isinstance(v, list) or not v:
        raise CliError("--features must hold at least one number")
    return v


def _envelope(obj: dict[str, Any], op: str, defaults: dict[str, Any], base_dir: Path, where: str) -> Request:
    """An envelope-ish object + defaults -> a validated Request (CliError naming ``where``)."""
    _check_line_keys(obj, op, where)
    d: dict[str, Any] = {"schema": obj.get("schema", REQUEST_SCHEMA_V1), "op": op}
    for key in ("event_id", "head_id", "client_id", "subject_id", "sample_id", "label", "ts"):
        if key in obj:
            d[key] = obj[key]
        elif defaults.get(key) is not None:
            d[key] = defaults[key]
    if "event_id" not in d:
        from unlearn.services.client.sdk import new_event_id

        d["event_id"] = new_event_id()
    given = _input_of(obj, base_dir, where)
    if given is not None:
        d["input"] = given
    elif defaults.get("input") is not None:
        d["input"] = defaults["input"]
    if op != "add":  # a delete takes no label/input even if defaults had them
        d.pop("label", None)
        d.pop("input", None)
    if op == "delete_subject":
        d.pop("sample_id", None)
    try:
        return request_from_dict(d)
    except InvalidRequest as exc:
        raise CliError(f"{where}: {exc.reason}: {exc.detail}") from None


def _check_line_keys(obj: dict[str, Any], op: str, where: str) -> None:
    """A line names only known fields, and no other op than the command's."""
    unknown = sorted(set(obj) - _LINE_KEYS)
    if unknown:
        raise CliError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    if "op" in obj and obj["op"] != op:
        raise CliError(f"{where}: op {obj['op']!r} does not match this command (op {op!r})")


def _input_of(obj: dict[str, Any], base_dir: Path, where: str) -> dict[str, Any] | None:
    """The envelope ``input`` a line gives (as ``input`` or one shorthand), or None."""
    shorthands = [k for k in ("input", "features", "text", "image_png", "image_file") if k in obj]
    if len(shorthands) > 1:
        raise CliError(f"{where}: give one input, not {', '.join(shorthands)}")
    if not shorthands:
        return None
    k = shorthands[0]
    v = obj[k]
    if k == "input":
        return v
    if k == "features":
        return {"kind": "features", "values": v}
    if k == "text":
        return {"kind": "text", "text": v}
    if k == "image_png":
        return {"kind": "image", "format": "png", "data": v}
    path = Path(v) if Path(v).is_absolute() else base_dir / v
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"{where}: cannot read image_file {str(path)!r}: {exc.strerror}") from None
    return {"kind": "image", "format": "png", "data": base64.b64encode(data).decode("ascii")}


def load_requests(lines: Sequence[str] | Any, op: str, defaults: dict[str, Any] | None = None,
                  base_dir: str | Path = ".", name: str = "<file>") -> list[Request]:
    """Validate every JSONL line (blank lines and lines starting with '#' are skipped) into a
    Request for ``op``; the first bad line raises CliError naming it."""
    out: list[Request] = []
    for i, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{name}:{i}"
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise CliError(f"{where}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise CliError(f"{where}: each line must be a JSON object")
        out.append(_envelope(obj, op, defaults or {}, Path(base_dir), where))
    return out


def _defaults(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    d: dict[str, Any] = {
        "head_id": args.head,
        "subject_id": args.subject,
        "client_id": args.client_id or ClientSettings.of(settings).client_id,
        "ts": time.time(),
    }
    if getattr(args, "sample", None) is not None:
        d["sample_id"] = args.sample
    if getattr(args, "label", None) is not None:
        d["label"] = _parse_label(args.label)
    if getattr(args, "features", None) is not None:
        d["input"] = {"kind": "features", "values": _parse_features(args.features)}
    elif getattr(args, "text", None) is not None:
        d["input"] = {"kind": "text", "text": args.text}
    elif getattr(args, "image", None) is not None:
        try:
            data = Path(args.image).read_bytes()
        except OSError as exc:
            raise CliError(f"--image {args.image!r}: {exc.strerror}") from None
        d["input"] = {"kind": "image", "format": "png", "data": base64.b64encode(data).decode("ascii")}
    return d


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def _run(command: str, argv: Sequence[str] | None) -> int:
    """Parse, build and validate every request, produce them (and with --wait collect receipts)."""
    op = _OP_OF_COMMAND[command]
    ap = _parser(command)
    try:
        args = ap.parse_args(argv)
        settings = settings_from_args(args)
        if args.key_file or args.key_id:
            settings = settings.with_(client_key_file=args.key_file or ClientSettings.of(settings).client_key_file,
                                      client_key_id=args.key_id or ClientSettings.of(settings).client_key_id)
    except (SystemExit, ValueError) as exc:
        return cli_exit_code(exc)
    try:
        reqs = _requests_of(args, op, _defaults(args, settings))
        return _produce_and_wait(settings, reqs, args, op)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _requests_of(args: argparse.Namespace, op: str, defaults: dict[str, Any]) -> list[Request]:
    """The validated requests: every line of ``--file``, or the one the options describe."""
    if not args.file:
        if args.event_id:
            defaults["event_id"] = args.event_id
        return [_envelope({}, op, defaults, Path("."), "arguments")]
    if args.event_id:
        raise CliError("--event-id names one request; put event_id on each --file line instead")
    if args.file == "-":
        reqs = load_requests(sys.stdin.readlines(), op, defaults, ".", "<stdin>")
    else:
        path = Path(args.file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise CliError(f"--file {args.file!r}: {exc.strerror}") from None
        reqs = load_requests(lines, op, defaults, path.parent, args.file)
    if not reqs:
        raise CliError(f"--file {args.file!r} holds no requests")
    return reqs


def _produce_and_wait(settings: Settings, reqs: list[Request], args: argparse.Namespace, op: str) -> int:
    """Produce ``reqs`` and wait for their acknowledgement; then print them, or with --wait
    collect and print their receipts. The exit code."""
    from unlearn.services.client.errors import ClientError
    from unlearn.services.client.sdk import UnlearnClient

    wait = bool(getattr(args, "wait", False))
    timeout = getattr(args, "timeout", None) or ClientSettings.of(settings).receipt_timeout
    show_bar = bool(args.file) and not args.quiet
    try:
        client = UnlearnClient(settings, listen_receipts=wait)
    except ClientError as exc:
        raise CliError(str(exc)) from None
    try:
        handles = _produce_all(client, reqs, op, timeout, show_bar)
        if wait:
            return _collect_receipts(client, handles, timeout, show_bar)
        if not args.quiet:
            for h in handles:
                _emit({"event_id": h.event_id, "op": h.op, "head_id": h.head_id, "subject_id": h.subject_id,
                       "sample_id": h.sample_id, "topic": client.requests_topic,
                       "partition": h.partition, "offset": h.offset})
        return 0
    finally:
        client.close()


def _produce_all(client: UnlearnClient, reqs: list[Request], op: str, timeout: float,
                 show_bar: bool) -> list[RequestHandle]:
    """Produce every request; CliError unless the broker acknowledged all of them in ``timeout``."""
    from tqdm import tqdm

    handles = []
    with tqdm(total=len(reqs), desc=f"producing {op}", unit="req", disable=not show_bar, file=sys.stderr) as bar:
        for r in reqs:
            handles.append(client.send(r))
            bar.update(1)
    left = client.flush(timeout)
    failed = [h for h in handles if not h.delivered]
    if left or failed:
        detail = "; ".join(f"{h.event_id}: {h.delivery_error or 'not acknowledged'}" for h in failed[:5])
        raise CliError(f"{len(failed) or left} of {len(handles)} requests were not delivered to "
                       f"{client.requests_topic} within {timeout:g}s ({detail})")
    return handles


def _collect_receipts(client: UnlearnClient, handles: list[RequestHandle], timeout: float, show_bar: bool) -> int:
    """Print each receipt as one JSON line, in order, all within ``timeout`` seconds together.
    Exit 1 if any is missing (naming them), 3 if any was rejected, else 0 (a tombstoned receipt
    is no failure: it says on stderr that nothing was removed)."""
    from tqdm import tqdm

    from unlearn.services.client.errors import DeliveryFailed

    deadline = time.monotonic() + timeout
    rejected = 0
    missing: list[str] = []
    with tqdm(total=len(handles), desc="receipts", unit="rcpt", disable=not show_bar, file=sys.stderr) as bar:
        for h in handles:
            try:
                r = h.wait_receipt(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                missing.append(h.event_id)
                bar.update(1)
                continue
            except DeliveryFailed as exc:
                raise CliError(str(exc)) from None
            _emit(receipt_to_dict(r))
            if r.status == "tombstoned":
                print(f"tombstoned: event {r.event_id} (head {r.head_id}) removed nothing (nothing of it was in the "
                      f"head); adds of it dated at or before {r.tombstone_ts} are refused", file=sys.stderr)
            elif r.status != "applied":
                rejected += 1
                print(f"rejected: event {r.event_id} (head {r.head_id}): {r.reason}", file=sys.stderr)
            bar.update(1)
    if missing:
        _report_missing(client, handles, missing, timeout)
        return EXIT_ERROR
    return EXIT_REJECTED if rejected else 0


def _report_missing(client: UnlearnClient, handles: list[RequestHandle], missing: list[str], timeout: float) -> None:
    wanted = set(missing)
    heads = sorted({h.head_id for h in handles if h.event_id in wanted})
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    print(f"error: timed out after {timeout:g}s waiting for {len(missing)} receipt(s) on "
          f"{client.receipts_topic}: event {shown} (head {', '.join(heads)}); are the featurizer and "
          "ledger workers running and caught up?", file=sys.stderr)


def add_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn add --head H --subject S --sample X --label Y (--features ..|--text ..|--image PNG)``
    or ``--file F.jsonl``."""
    return _run("add", argv)


def delete_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn delete --head H --subject S --sample X [--wait] [--timeout T]`` or ``--file``."""
    return _run("delete", argv)


def delete_subject_main(argv: Sequence[str] | None = None) -> int:
    """``unlearn delete-subject --head H --subject S [--wait] [--timeout T]`` or ``--file``."""
    return _run("delete-subject", argv)

