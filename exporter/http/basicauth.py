"""HTTP basic auth against the bcrypt hashes of a ``--web.config.file``.

bcrypt is slow by design (50-250 ms per check). A successful check is remembered per user
as a keyed BLAKE2b digest of (user, password) under a random per-process key, never the
password itself, and later requests compare digests with ``hmac.compare_digest``: a scrape
with known-good credentials costs microseconds and is answered on the server's event loop
(:meth:`BasicAuth.check_cached`); only a miss needs :meth:`BasicAuth.check`, which the
server runs on a worker thread. Failed checks are not remembered, run one at a time (a
password-guessing client gets one core, not all), and an unknown user is checked against a
dummy hash so timing does not reveal which users exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from collections.abc import Mapping

#: The challenge sent with every 401.
AUTHENTICATE = 'Basic realm="fabricscope"'


def verify_password(password: bytes, hashed: bytes) -> bool:
    """bcrypt check; a password bcrypt refuses (over 72 bytes) simply does not match.
    bcrypt is imported where a hash is checked or made: an agent without basic auth users
    runs without it installed."""
    import bcrypt

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, remembering
    successes. Thread-safe."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._hashes = {
            user.encode("utf-8"): hashed.encode("ascii") for user, hashed in users.items()
        }
        self._key = secrets.token_bytes(32)
        self._verified: dict[bytes, bytes] = {}
        self._bcrypt_lock = threading.Lock()
        self._dummy = b""
        if self._hashes:
            import bcrypt

            cost = max(int(h.split(b"$")[2]) for h in self._hashes.values())
            self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=cost))

    @property
    def enabled(self) -> bool:
        return bool(self._hashes)

    def check_cached(self, authorization: str | None) -> bool | None:
        """Decide without bcrypt where possible: False for a missing or malformed header,
        True for credentials verified before, None when only :meth:`check` can tell."""
        parsed = self._parse(authorization)
        if parsed is None:
            return False
        user, _, digest = parsed
        known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, digest):
            return True
        return None

    def check(self, authorization: str | None) -> bool:
        """The full check (bcrypt on a cache miss: 50-250 ms; call it off the event loop)."""
        parsed = self._parse(authorization)
        if parsed is None:
            return False
        user, password, digest = parsed
        known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, digest):
            return True
        hashed = self._hashes.get(user)
        with self._bcrypt_lock:
            # Unknown users cost a bcrypt check too, so timing does not tell them apart.
            ok = verify_password(password, hashed if hashed is not None else self._dummy)
            if ok and hashed is not None:
                self._verified[user] = digest
                return True
        return False

    def _parse(self, authorization: str | None) -> tuple[bytes, bytes, bytes] | None:
        """(user, password, keyed digest of both), or None for anything but Basic creds."""
        if authorization is None:
            return None
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        digest = hashlib.blake2b(
            len(user).to_bytes(4, "big") + user + password, key=self._key, digest_size=32
        ).digest()
        return user, password, digest
