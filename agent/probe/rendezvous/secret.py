"""The shared probe secret: read it from its file, check its length.

Both nodes of a probe pair prove they hold it (:mod:`agent.probe.rendezvous.wire`); it
never crosses the wire and neither it nor anything derived from it is logged.
"""

from __future__ import annotations

import os
import stat

from agent.core.errors import ConfigError

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096

_SECRET_HINT = "e.g. head -c 32 /dev/urandom | base64 > {path} && chmod 600 {path}"


def load_secret(path: str) -> bytes:
    """Read the shared probe secret; strip one trailing newline.

    ConfigError, naming ``path`` but never the content, if the file is missing, unreadable,
    not a regular file, readable by every user, empty, or not 16..4096 bytes long.
    """
    hint = _SECRET_HINT.format(path=path)
    try:
        # O_NONBLOCK: a FIFO in place of the file must not hang the agent
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"probe secret file {path} does not exist; create it, {hint}") from None
    except OSError as exc:
        raise ConfigError(f"probe secret file {path} cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"probe secret file {path} is not a regular file")
        if st.st_mode & 0o004:
            raise ConfigError(
                f"probe secret file {path} is readable by every user "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path} "
                "(for a Kubernetes Secret volume set defaultMode: 0400)"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRET_BYTES + 2:
            chunk = os.read(fd, MAX_SECRET_BYTES + 3 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"probe secret file {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    data = data[:-2] if data.endswith(b"\r\n") else data.removesuffix(b"\n")
    if not data:
        raise ConfigError(f"probe secret file {path} is empty; fill it, {hint}")
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"probe secret file {path} is shorter than {MIN_SECRET_BYTES} bytes; "
            f"use a longer secret, {hint}"
        )
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"probe secret file {path} is longer than {MAX_SECRET_BYTES} bytes")
    return data


def check_secret(secret: bytes) -> None:
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"probe secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes (see load_secret)"
        )
