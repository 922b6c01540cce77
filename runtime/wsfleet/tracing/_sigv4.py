"""SigV4 for OTLP requests sent straight to X-Ray's endpoint (no collector to sign them):
a ``requests`` session, as the OTLP/HTTP exporter takes, that signs each request with
botocore's signer (service ``xray``) and the credentials of the standard chain (in
Lambda, the function's role), read afresh per request so that rotated ones are used."""

from __future__ import annotations

from typing import Any

import botocore.session
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

SERVICE = "xray"


class SigV4Session(requests.Session):
    def __init__(self, region: str, credentials: Any = None) -> None:
        super().__init__()
        self._region = region
        self._credentials = credentials if credentials is not None else botocore.session.Session().get_credentials()

    def request(self, method: str, url: str, *args: Any, headers: Any = None, data: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        if self._credentials is None:
            raise RuntimeError("no AWS credentials to sign the span export to X-Ray with")
        signed = AWSRequest(method=method, url=url, data=data, headers=dict(headers or {}))
        SigV4Auth(self._credentials.get_frozen_credentials(), SERVICE, self._region).add_auth(signed)
        return super().request(method, url, *args, headers=dict(signed.headers.items()), data=data, **kwargs)
