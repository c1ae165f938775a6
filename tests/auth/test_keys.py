"""API key files: keys made by `tfservo keys new` are stored as hashes only, checked with their
scopes and models, and a rotated file is read again without a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfservo.auth.keys import KeyRing, NotAllowed, Unauthenticated, add_key, bearer, read_keys
from tfservo.core.errors import InvalidArgument

TFSERVO = str(Path(sys.executable).with_name("tfservo"))


def test_a_new_key_is_stored_as_its_hash_and_checked_with_its_scopes_and_models(tmp_path):
    path = str(tmp_path / "keys.json")
    reader = add_key(path, "reader", ["read"])
    caller = add_key(path, "ci-bot", ["invoke", "read"], models=["half_plus_ten"])
    text = Path(path).read_text()
    assert reader not in text and caller not in text  # hashes only
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    ring = KeyRing(path)
    bot = ring.authenticate(caller)
    assert bot.name == "ci-bot"
    ring.authorize(bot, "invoke", "half_plus_ten")
    with pytest.raises(NotAllowed, match="may not call model 'other'"):
        ring.authorize(bot, "invoke", "other")
    with pytest.raises(NotAllowed, match="lacks the 'manage' scope"):
        ring.authorize(bot, "manage", None)
    with pytest.raises(NotAllowed, match="lacks the 'invoke' scope"):
        ring.authorize(ring.authenticate(reader), "invoke", "half_plus_ten")
    for presented in (None, "", "tfsk_not-a-key", "é" * 5000):
        with pytest.raises(Unauthenticated):
            ring.authenticate(presented)


def test_a_rotated_file_is_read_again_and_a_broken_one_keeps_the_old_keys(tmp_path):
    path = str(tmp_path / "keys.json")
    old = add_key(path, "svc", ["invoke"])
    ring = KeyRing(path)
    assert ring.authenticate(old).name == "svc"
    Path(path).unlink()
    new = add_key(path, "svc", ["invoke"])
    os.utime(path, (time.time() + 5, time.time() + 5))
    time.sleep(1.1)
    assert ring.authenticate(new).name == "svc"
    with pytest.raises(Unauthenticated):
        ring.authenticate(old)
    Path(path).write_text("{not json")
    os.utime(path, (time.time() + 10, time.time() + 10))
    time.sleep(1.1)
    assert ring.authenticate(new).name == "svc"  # the broken version is logged, not used


@pytest.mark.parametrize("doc, says", [
    ("[]", "expected"),
    ('{"keys": [{"sha256": "' + "a" * 64 + '", "scopes": ["read"]}]}', "needs a name"),
    ('{"keys": [{"name": "x", "sha256": "short", "scopes": ["read"]}]}', "64 lowercase hex"),
    ('{"keys": [{"name": "x", "sha256": "' + "a" * 64 + '", "scopes": ["root"]}]}', "scopes must be"),
    ('{"keys": [{"name": "x", "sha256": "' + "a" * 64 + '", "scopes": ["read"], "models": "m"}]}', "models must be"),
])
def test_a_bad_key_file_names_what_is_wrong(tmp_path, doc, says):
    path = tmp_path / "keys.json"
    path.write_text(doc)
    with pytest.raises(InvalidArgument, match=says):
        read_keys(str(path))


def test_bearer_values():
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer") is None and bearer(None) is None


def test_tfservo_keys_new_prints_the_key_once(tmp_path):
    path = tmp_path / "keys.json"
    done = subprocess.run([TFSERVO, "keys", "new", "--file", str(path), "--name", "ci-bot", "--scope", "invoke",
                           "--scope", "read", "--model", "half_plus_ten"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("tfsk_") and key not in path.read_text()
    (entry,) = json.loads(path.read_text())["keys"]
    assert entry["name"] == "ci-bot" and entry["scopes"] == ["invoke", "read"] and entry["models"] == ["half_plus_ten"]
    assert KeyRing(str(path)).authenticate(key).name == "ci-bot"
    refused = subprocess.run([TFSERVO, "keys", "new", "--file", str(path), "--name", "x", "--scope", "root"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "root" in refused.stderr
