"""AWS Signature Version 4 on SageMaker's runtime API, checked as AWS checks it, so that boto3,
the AWS CLI and the SageMaker SDK authenticate unchanged with their users' keys.

The keys come from a file in the AWS shared-credentials format (one `[profile]` per key, its
`aws_access_key_id` and `aws_secret_access_key`), re-read when it changes. The canonical
request and signature are botocore's own (`SigV4Auth`, the signer those clients use), fed the
request as it arrived: the raw path, the headers the client signed, the body it sent; this
module is the one place tfservo leans on botocore's signer.

The payload's hash is always the hash of the body as received: a signed `x-amz-content-sha256`
must equal it, and `UNSIGNED-PAYLOAD` or `STREAMING-*` are refused (botocore signs the body of
every sagemaker-runtime call), so a signature seen once cannot carry another body.
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tfservo.auth.replay import ReplayCache
from tfservo.auth.watched import WatchedFile
from tfservo.core.errors import InvalidArgument, PermissionDenied

__all__ = ["SIGNED_SERVICE", "Credentials", "SigV4Verifier", "SignatureRefused", "read_credentials"]

log = logging.getLogger("tfservo.audit")

SIGNED_SERVICE = "sagemaker"  # the service botocore signs sagemaker-runtime calls for
_SKEW = datetime.timedelta(minutes=5)
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<signature>[0-9a-f]{64})\s*"
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


class SignatureRefused(PermissionDenied):
    """A runtime-API request whose signature does not pass: `error_type` is the AWS error code
    botocore raises as ClientError (x-amzn-ErrorType), `aws_status` AWS's HTTP status for it."""

    def __init__(self, error_type: str, message: str, status: int = 403, key: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.aws_status = status
        self.key = key  # the access key id the request named, for the audit line ("" if none)


@dataclass(frozen=True)
class Credentials:
    """One accepted key: its access key id, secret and the profile that names it."""

    access_key: str
    secret_key: str
    name: str


def read_credentials(path: str) -> dict[str, Credentials]:
    """The keys of an AWS shared-credentials file by access key id (InvalidArgument naming the
    file and profile when it cannot be used)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as exc:
        raise InvalidArgument(f"--sigv4-credentials {path}: cannot read it ({exc.strerror})") from None
    except configparser.Error as exc:
        raise InvalidArgument(f"--sigv4-credentials {path}: not an AWS credentials file ({exc})") from None
    keys: dict[str, Credentials] = {}
    for profile in parser.sections():
        section = parser[profile]
        access, secret = section.get("aws_access_key_id", "").strip(), section.get("aws_secret_access_key", "").strip()
        if not access or not secret:
            raise InvalidArgument(
                f"--sigv4-credentials {path}: profile [{profile}] needs aws_access_key_id and aws_secret_access_key"
            )
        keys[access] = Credentials(access, secret, profile)
    if not keys:
        raise InvalidArgument(f"--sigv4-credentials {path}: no [profile] with aws_access_key_id and aws_secret_access_key")
    return keys


class SigV4Verifier:
    """Checks requests against the keys in one credentials file."""

    def __init__(
        self, path: str, clock: type[datetime.datetime] = datetime.datetime, replay: ReplayCache | None = None,
    ) -> None:
        self._clock = clock
        self.replay = replay  # --sigv4-replay-window: a signature accepted once is refused again
        self.file = WatchedFile(path, read_credentials, "sigv4 credentials")
        log.info("sigv4: the SageMaker runtime API takes only requests signed with the %d key(s) in %s",
                 len(self.file.current()), path)

    def keys(self) -> dict[str, Credentials]:
        """The current keys (the file is read again when it has changed)."""
        return self.file.current()

    def verify(self, method: str, raw_path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes) -> Credentials:
        """The key that signed this request, or SignatureRefused as AWS words it."""
        fields: dict[str, list[str]] = {}
        for name, value in headers:
            fields.setdefault(name.lower(), []).append(value)
        authorization = (fields.get("authorization") or [""])[0]
        if not authorization:
            raise SignatureRefused("MissingAuthenticationTokenException", "Missing Authentication Token")
        match = _AUTHORIZATION.fullmatch(authorization)
        if match is None:
            raise SignatureRefused(
                "IncompleteSignatureException",
                "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters "
                "of an AWS4-HMAC-SHA256 signature",
                400,
            )
        parts = match["credential"].split("/")
        if len(parts) != 5 or parts[4] != "aws4_request":
            raise SignatureRefused("IncompleteSignatureException",
                                   "Credential should be ACCESS_KEY/YYYYMMDD/REGION/SERVICE/aws4_request", 400)
        access_key, day, region, service, _ = parts
        key = self.keys().get(access_key)
        if key is None:
            raise SignatureRefused("UnrecognizedClientException", "The security token included in the request is invalid.",
                                   key=access_key)
        stamp = (fields.get("x-amz-date") or [""])[0]
        try:
            signed_at = datetime.datetime.strptime(stamp, _AMZ_DATE).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            raise SignatureRefused("IncompleteSignatureException",
                                   "X-Amz-Date must be present and in the form YYYYMMDD'T'HHMMSS'Z'", 400,
                                   key=access_key) from None
        self._check_time(signed_at, stamp, access_key)
        if day != stamp[:8]:
            raise SignatureRefused("InvalidSignatureException", "Date in Credential scope does not match YYYYMMDD "
                                   "from ISO-8601 version of date from HTTP", key=access_key)
        if service != SIGNED_SERVICE:
            raise SignatureRefused("InvalidSignatureException",
                                   f"Credential should be scoped to correct service: '{SIGNED_SERVICE}'.", key=access_key)
        signed = match["signed"].split(";")
        if "host" not in signed or any(name not in fields for name in signed):
            raise SignatureRefused("InvalidSignatureException",
                                   "SignedHeaders must include host and name only headers the request has", key=access_key)
        _check_payload(fields, body, access_key)
        expected = _signature(key, region, method, raw_path, query, {n: fields[n] for n in signed}, body, stamp)
        if not hmac.compare_digest(expected, match["signature"]):
            raise SignatureRefused(
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided. Check your AWS "
                "Secret Access Key and signing method. Consult the service documentation for details.",
                key=access_key,
            )
        if self.replay is not None and not self.replay.first_use(match["signature"]):
            raise SignatureRefused(
                "InvalidSignatureException",
                f"This request was already received: each signature is accepted once within "
                f"{self.replay.window:g} s (--sigv4-replay-window); sign each request anew", key=access_key,
            )
        return key

    def _check_time(self, signed_at: datetime.datetime, stamp: str, access_key: str) -> None:
        now = self._clock.now(datetime.timezone.utc)
        if signed_at < now - _SKEW:
            raise SignatureRefused(
                "InvalidSignatureException",
                f"Signature expired: {stamp} is now earlier than {(now - _SKEW).strftime(_AMZ_DATE)} "
                f"({now.strftime(_AMZ_DATE)} - 5 min.)", key=access_key,
            )
        if signed_at > now + _SKEW:
            raise SignatureRefused(
                "InvalidSignatureException",
                f"Signature not yet current: {stamp} is still later than {(now + _SKEW).strftime(_AMZ_DATE)} "
                f"({now.strftime(_AMZ_DATE)} + 5 min.)", key=access_key,
            )


def _check_payload(fields: dict[str, list[str]], body: bytes, access_key: str) -> None:
    """The payload hash a client declares, if it does, must be the body's: SignatureRefused if not."""
    declared = fields.get("x-amz-content-sha256")
    if declared is None:
        return  # botocore's sagemaker-runtime signer: the signature covers the body's own hash
    value = declared[0].strip()
    if len(declared) > 1 or value == "UNSIGNED-PAYLOAD" or value.startswith("STREAMING-"):
        raise SignatureRefused(
            "InvalidSignatureException",
            f"x-amz-content-sha256 {value[:40]!r} is not accepted here: the SageMaker runtime API needs the body "
            "signed (botocore signs it for every InvokeEndpoint; sign with the body's SHA-256)",
            400, key=access_key,
        )
    if not hmac.compare_digest(value.lower().encode("utf-8", "replace"), hashlib.sha256(body).hexdigest().encode()):
        raise SignatureRefused("InvalidSignatureException",
                               "The provided 'x-amz-content-sha256' header does not match what was computed.",
                               400, key=access_key)


def _signature(
    key: Credentials, region: str, method: str, raw_path: str, query: str, signed: dict[str, list[str]], body: bytes,
    stamp: str,
) -> str:
    """The signature botocore's signer makes for this request with `key` (the same canonical
    request: method, path, query, the signed headers' values, the payload's hash)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    host = signed["host"][0]
    url = f"http://{host}{raw_path}" + (f"?{query}" if query else "")
    request = AWSRequest(method=method, url=url, data=body, headers={n: ",".join(values) for n, values in signed.items()})
    request.context["timestamp"] = stamp
    signer = SigV4Auth(BotoCredentials(key.access_key, key.secret_key), SIGNED_SERVICE, region)
    canonical = signer.canonical_request(request)
    return str(signer.signature(signer.string_to_sign(request, canonical), request))

