"""Signed bundles: a manifest of every file's SHA-256, signed with Ed25519 (the `cryptography` package).

`tfservo sign DIR` writes `tfservo-signature.json` into DIR (a bundle, a model dir or a version
dir): the manifest (paths relative to DIR) and a detached signature over it; `tfservo sign
ARCHIVE` writes the same file into the archive, over its members. With --require-signature KEYS
every load checks the files it is about to read — a version dir's, a code/ dir's — against the
nearest signature above them: a file missing from the manifest (added after signing), altered
or gone, or a signature no key in KEYS made, fails the load naming the file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from tfservo.core.errors import Code, ModelLoadError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["SIGNATURE_FILE", "Signature", "TrustedKeys", "listed_files", "new_key", "sha256_file", "sign_path", "verify_dir"]

SIGNATURE_FILE = "tfservo-signature.json"
_FORMAT = "tfservo-manifest/1"
_MAX_SEARCH_UP = 4  # version dir → model dir → bundle root → an archive's wrapper dir
_PEM_PUBLIC = b"-----BEGIN PUBLIC KEY-----"


@dataclass(frozen=True)
class Signature:
    """A read signature file: where it is, the files it lists and the key that made it."""

    root: str
    files: dict[str, str]  # path relative to root (with '/') → sha256
    key: str  # the signing key's id (see key_id)


class TrustedKeys:
    """The Ed25519 public keys of a --require-signature KEYS file (one or more PEM blocks)."""

    def __init__(self, path: str) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        self.path = path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ModelLoadError(f"cannot read the signing keys {path}: {exc.strerror}") from None
        self.keys: dict[str, Ed25519PublicKey] = {}
        for block in data.split(_PEM_PUBLIC)[1:]:
            try:
                key = load_pem_public_key(_PEM_PUBLIC + block)
            except ValueError:
                raise ModelLoadError(f"{path} holds a public key that is not PEM; write keys with "
                                     "`tfservo sign --new-key FILE` (its FILE.pub)") from None
            if not isinstance(key, Ed25519PublicKey):
                raise ModelLoadError(f"{path} holds a {type(key).__name__}: tfservo signatures are Ed25519")
            self.keys[key_id(key)] = key
        if not self.keys:
            raise ModelLoadError(f"{path} holds no PEM public key ({_PEM_PUBLIC.decode()} …)")

    def verify(self, signature_file: str) -> Signature:
        """The signature at `signature_file`, checked against these keys (else ModelLoadError)."""
        from cryptography.exceptions import InvalidSignature

        try:
            with open(signature_file, "rb") as f:
                doc = json.loads(f.read(64 * 2**20))
            files, key, signed = doc["files"], doc["key"], base64.b64decode(doc["signature"], validate=True)
            if doc.get("format") != _FORMAT or not isinstance(files, dict) or not isinstance(key, str):
                raise ValueError("not a tfservo manifest")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _refused(f"its signature {signature_file} is unreadable ({exc})") from None
        public = self.keys.get(key)
        if public is None:
            raise _refused(f"{signature_file} is signed by key {key}, which is not in {self.path}")
        try:
            public.verify(signed, _message(files))
        except InvalidSignature:
            raise _refused(f"{signature_file} does not verify with key {key}: the manifest was altered") from None
        return Signature(os.path.dirname(signature_file), {str(k): str(v) for k, v in files.items()}, key)


def key_id(public: Ed25519PublicKey) -> str:
    """A public key's short id: the first 16 hex digits of the SHA-256 of its raw bytes."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def new_key(path: str) -> str:
    """Write a new Ed25519 private key to `path` (mode 600) and its public key to `path`.pub; its id."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    private = Ed25519PrivateKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with open(path + ".pub", "wb") as f:
        f.write(private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return key_id(private.public_key())


def sign_path(path: str, key_file: str) -> tuple[str, int]:
    """Sign the dir or archive `path` with the private key in `key_file`; (what was written, files listed)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    with open(key_file, "rb") as f:
        private = load_pem_private_key(f.read(), password=None)
    if not isinstance(private, Ed25519PrivateKey):
        raise ModelLoadError(f"{key_file} is not an Ed25519 private key; make one with `tfservo sign --new-key FILE`")
    if os.path.isdir(path):
        files = {rel: sha256_file(os.path.join(path, rel)) for rel in listed_files(path)}
        doc = _document(files, private)
        target = os.path.join(path, SIGNATURE_FILE)
        with open(target, "wb") as f:
            f.write(doc)
        return target, len(files)
    if tarfile.is_tarfile(path):
        return path, _sign_archive(path, private)
    raise ModelLoadError(f"{path} is neither a dir nor a tar archive; sign the bundle dir or its model.tar.gz")


def verify_dir(path: str, keys: TrustedKeys, what: str) -> None:
    """Check every file under `path` (`what` names it: model, version, code) against the nearest
    signature at or above it; ModelLoadError naming the first file that is unsigned, altered or gone."""
    signature = _nearest_signature(path)
    if signature is None:
        raise _refused(f"{what} at {path} is not signed: no {SIGNATURE_FILE} at or above it "
                       f"(sign it with `tfservo sign DIR --key KEY`)")
    signed = keys.verify(signature)
    base = os.path.relpath(os.path.realpath(path), os.path.realpath(signed.root)).replace(os.sep, "/")
    prefix = "" if base == "." else base + "/"
    present = set()
    for rel in listed_files(path):
        key = prefix + rel
        present.add(key)
        want = signed.files.get(key)
        if want is None:
            raise _refused(f"{what}: {os.path.join(path, rel)} is not in the signed manifest {signature} "
                           "(added after signing: sign the bundle again)")
        if sha256_file(os.path.join(path, rel)) != want:
            raise _refused(f"{what}: {os.path.join(path, rel)} differs from what was signed in {signature}")
    gone = sorted(k for k in signed.files if k.startswith(prefix) and k not in present)
    if gone:
        raise _refused(f"{what}: {gone[0]} was signed in {signature} but is missing")


def _refused(reason: str) -> ModelLoadError:
    return ModelLoadError(f"Refusing to load: {reason}; --require-signature loads only signed bundles",
                          Code.FAILED_PRECONDITION)


def _nearest_signature(path: str) -> str | None:
    current = os.path.realpath(path)
    for _ in range(_MAX_SEARCH_UP + 1):
        candidate = os.path.join(current, SIGNATURE_FILE)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return None


def listed_files(top: str) -> Iterator[str]:
    """Every file under `top` a load could read, relative with '/', the signature files left out;
    a link counts as the file it names (hashing follows it), so a link swapped later is caught."""
    for root, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name == SIGNATURE_FILE:
                continue
            yield os.path.relpath(os.path.join(root, name), top).replace(os.sep, "/")


def _message(files: dict[str, str]) -> bytes:
    return json.dumps({"files": files, "format": _FORMAT}, sort_keys=True, separators=(",", ":")).encode()


def _document(files: dict[str, str], private: Ed25519PrivateKey) -> bytes:
    public = private.public_key()
    signed = private.sign(_message(files))
    return json.dumps({"format": _FORMAT, "key": key_id(public), "files": files,
                       "signature": base64.b64encode(signed).decode()}, indent=1, sort_keys=True).encode()


def _sign_archive(path: str, private: Ed25519PrivateKey) -> int:
    """Rewrite the archive at `path` with the signature as a member at its root."""
    files: dict[str, str] = {}
    with tarfile.open(path) as archive:
        members = archive.getmembers()
        for member in members:
            name = _member_name(member.name)
            if member.isfile() and name and os.path.basename(name) != SIGNATURE_FILE:
                extracted = archive.extractfile(member)
                assert extracted is not None
                files[name] = _sha256_stream(extracted)
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".signing-")
        os.close(fd)
        try:
            mode = "w:gz" if path.endswith((".gz", ".tgz")) else "w"
            with tarfile.open(temp, mode) as out:  # type: ignore[call-overload]
                for member in members:
                    if os.path.basename(_member_name(member.name)) == SIGNATURE_FILE:
                        continue
                    out.addfile(member, archive.extractfile(member) if member.isfile() else None)
                doc = _document(files, private)
                info = tarfile.TarInfo(SIGNATURE_FILE)
                info.size, info.mode = len(doc), 0o644
                out.addfile(info, io.BytesIO(doc))
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    return len(files)


def _member_name(name: str) -> str:
    """An archive member's path as it is extracted ('./1/x' → '1/x'; '.' → '')."""
    normal = posixpath.normpath(name)
    return "" if normal == "." else normal


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return _sha256_stream(f)


def _sha256_stream(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()
