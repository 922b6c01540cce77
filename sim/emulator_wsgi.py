"""WSGI plumbing the emulator's layers share: what a request is (service, DynamoDB
operation), its body read and put back, and a JSON answer."""

from __future__ import annotations

import io
import json
import random
import re
from typing import Any, Callable, Iterable

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]
_DYNAMODB_TARGET = "DynamoDB_20120810."


def operation(environ: dict) -> str | None:
    """The DynamoDB operation of a request ("UpdateItem"), None for other services."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    return target[len(_DYNAMODB_TARGET):] if target.startswith(_DYNAMODB_TARGET) else None


def service(environ: dict) -> str:
    """The AWS service a request is signed for ("dynamodb", "sqs", ...), "" if unsigned."""
    match = re.search(r"Credential=[^/]*/[^/]*/[^/]*/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    return match.group(1) if match else ""


def json_response(status: str, body: Any, start_response: Callable) -> list[bytes]:
    raw = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(raw)))])
    return [raw]


def answer_of(app: WSGIApp, environ: dict) -> tuple[str, list, bytes]:
    """Call the next application and hold its whole answer (status, headers, body, what
    it wrote through ``write`` included) instead of sending it: the request is applied."""
    answer: list[tuple[str, list]] = []
    written: list[bytes] = []

    def capture(status: str, headers: list, *exc: Any) -> Callable[[bytes], None]:
        answer[:] = [(status, headers)]
        return written.append

    body = list(app(environ, capture))
    status, headers = answer[0]
    return status, headers, b"".join(written + body)


def aws_error(start_response: Callable, status: str, kind: str, message: str) -> list[bytes]:
    """An AWS JSON error answer (``__type`` ``kind``), as the services send one."""
    body = json.dumps({"__type": kind, "message": message}).encode()
    start_response(status, [
        ("Content-Type", "application/x-amz-json-1.0"),
        ("Content-Length", str(len(body))),
        ("x-amzn-RequestId", f"wsfleet-fault-{random.getrandbits(32):08x}"),
    ])
    return [body]


def read_body(environ: dict) -> bytes:
    """The request body, put back so that the next application can read it too."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body
