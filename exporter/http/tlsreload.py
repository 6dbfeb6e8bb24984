"""The server's TLS context, rebuilt when a certificate, key or CA file changes.

Files are checked (one ``stat`` each) once per new connection, so a rotated certificate
(cert-manager, a renewed Secret) is used from the next connection on without a restart; a
bad new pair is logged and the previous one kept.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

from agent.core.errors import ConfigError
from exporter.http.webconfig import TLSServerConfig

log = logging.getLogger(__name__)


class ReloadingTLSContext:
    """``current()`` is the SSLContext for a new connection."""

    def __init__(self, config: TLSServerConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._stamp = self._fingerprint()
        self._context = config.ssl_context()

    def current(self) -> ssl.SSLContext:
        stamp = self._fingerprint()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._context = self.config.ssl_context()
                        log.info("reloaded TLS certificate %s", self.config.cert_file)
                    except ConfigError as e:
                        log.warning(
                            "TLS files changed but cannot be used, keeping the old ones: %s", e
                        )
        return self._context

    def _fingerprint(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for path in self.config.files():
            try:
                st = os.stat(path)  # follows symlinks: a swapped Secret mount changes st_ino
            except OSError:
                out.append(None)
            else:
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)
