"""The node's pods from the Kubernetes API server, kept current in a background thread.

:class:`PodWatcher` lists the pods of one node once (``fieldSelector=spec.nodeName=<node>``)
and then watches them from the list's resourceVersion, keeping an immutable
:class:`PodIndex` (pod UID -> namespace, name, container ids -> names) that a sampling pass
reads without waiting on the network (the index and the pod model live in
:mod:`agent.kubernetes.pods`, importable without this module's HTTP). Its list+watch loop
is :class:`ListWatch`, which the probe's Kubernetes membership
(:mod:`agent.probe.schedule.k8s_members`) runs too. Only the few fields it needs are read
from the raw JSON, one list item at a time (no model deserialization, no whole list decoded
at once): what the index keeps stays flat from 110 to 1,000 pods. Requests go through
:mod:`agent.kubernetes.apiconn` (the standard library's HTTP), not the ``kubernetes``
client, whose import alone would cost the resident process about 37 MiB.
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from agent.kubernetes.apiconn import (
    ApiConnection,
    ApiEndpoint,
    ApiStatusError,
    KubeConfigError,
    default_endpoint,
    endpoint_of,
)
from agent.kubernetes.pods import PodIndex, PodMeta, parse_pod, resource_version

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    #: what makes the client: an endpoint, or a ``kubernetes`` ApiClient built elsewhere
    ClientFactory = Callable[[], ApiEndpoint | ApiClient]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the error reasons the watcher reports through ``on_error``
WATCH_ERROR_REASONS = ("api_error", "api_forbidden")


# --- the API watch ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """How :class:`PodWatcher` talks to the API server. Times in seconds.

    ``watch_timeout_seconds``: the server ends each watch after this long (a new one starts
    from the latest resourceVersion); ``read_timeout_seconds``: a watch silent for longer is
    dropped as broken (bookmarks keep a healthy one talking); backoff doubles from
    ``backoff_initial_seconds`` to ``backoff_max_seconds`` while requests fail.
    """

    watch_timeout_seconds: int = 300
    connect_timeout_seconds: float = 5.0
    list_timeout_seconds: float = 30.0
    read_timeout_seconds: float = 330.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0


class WatchExpired(Exception):  # noqa: N818 - control flow: the watch's resourceVersion is gone
    pass


class WatchStatusError(Exception):
    """An API ``Status`` delivered as a watch ERROR event."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"HTTP {code} {reason}")
        self.code = code


class HttpStream(Protocol):  # an open answer (agent.kubernetes.apiconn.ApiResponse)
    @property
    def chunked(self) -> bool: ...

    def stream(
        self, amt: int | None = ..., decode_content: bool | None = ...
    ) -> Iterator[bytes]: ...

    def read1(self, amt: int | None = ..., decode_content: bool | None = ...) -> bytes: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


def iter_lines(resp: HttpStream) -> Iterator[bytes]:
    """Newline-delimited lines of a watch response, each as soon as it has arrived."""
    if resp.chunked:
        chunks: Iterator[bytes] = resp.stream(None)
    else:
        chunks = iter(lambda: resp.read1(65536), b"")
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buf.strip():
        yield buf


def watch_event(event: object) -> tuple[object, object]:
    """(type, object) of one watch event; an ERROR event raises :class:`WatchExpired` (410:
    relist) or :class:`WatchStatusError`."""
    if not isinstance(event, dict):
        raise ValueError("watch event is not an object")
    kind, obj = event.get("type"), event.get("object")
    if kind == "ERROR":
        status = obj if isinstance(obj, dict) else {}
        code = status.get("code")
        if code == 410:
            raise WatchExpired
        raise WatchStatusError(code if isinstance(code, int) else 0, str(status.get("reason")))
    return kind, obj


def consume_watch(
    resp: HttpStream,
    apply: Callable[[object, str], str],
    version: str,
    *,
    stop: threading.Event,
    backoff_seconds: float,
    detach: Callable[[], None],
) -> str:
    """Apply every event of an open watch stream (``apply(event, version) -> version``)
    until it ends or ``stop`` is set; ``detach`` runs before the connection is released.
    A watch that ends at once with no event (a proxy cutting it short) waits
    ``backoff_seconds`` so the caller does not spin on the server. Returns the last
    resourceVersion seen."""
    started, events = time.monotonic(), 0
    try:
        for line in iter_lines(resp):
            version = apply(json.loads(line), version)
            events += 1
            if stop.is_set():
                break
    finally:
        detach()
        resp.release_conn()
    if not events and time.monotonic() - started < backoff_seconds:
        stop.wait(backoff_seconds)
    return version


def interrupt_stream(resp: HttpStream | None, what: str) -> None:
    """Unblock a thread reading ``resp`` (an open watch) and close it."""
    if resp is None:
        return
    shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3 unblocks a read
    try:
        if callable(shutdown):
            shutdown()
        resp.close()
    except (OSError, ValueError, RuntimeError):
        log.debug("%s: closing the stream failed", what, exc_info=True)


def classify_watch_error(exc: Exception) -> tuple[str, str, bool] | None:
    """What a list/watch failure means: None when the resourceVersion expired (410: relist
    at once), else (reason ``api_forbidden`` | ``api_error``, detail, expected). An
    unexpected exception is still an ``api_error`` (the thread must outlive anything the
    client raises); ``expected`` False asks the caller to log its traceback."""
    import http.client

    if isinstance(exc, WatchExpired):
        return None
    if isinstance(exc, ApiStatusError):
        if exc.status == 410:
            return None
        reason = "api_forbidden" if exc.status == 403 else "api_error"
        return reason, str(exc), True
    if isinstance(exc, WatchStatusError):
        return ("api_forbidden" if exc.code == 403 else "api_error"), str(exc), True
    if isinstance(exc, (http.client.HTTPException, OSError, ValueError, KubeConfigError)):
        return "api_error", repr(exc), True
    return "api_error", repr(exc), False


def default_api_client() -> ApiEndpoint:
    """The in-cluster configuration when running in a pod, else the kubeconfig."""
    return default_endpoint(os.environ)


class _ListReader:
    """Decodes a list answer's top-level object a value at a time from ``read(n)`` (bytes;
    b"" at the end), never the whole list at once: :meth:`members` yields each top-level
    key and its value, except that the ``items`` array yields each item as ``("items",
    item)``. Reads grow with what a value needs (doubling), so a huge item costs linear
    time, not a re-decode per chunk."""

    def __init__(self, read: Callable[[int], bytes], chunk: int = 1 << 16) -> None:
        self._read = read
        self._chunk = chunk
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._decoder = json.JSONDecoder()
        #: the answer held an ``items`` array (perhaps empty)
        self.saw_items = False

    def _fill(self, want: int = 0) -> None:
        """Read at least ``want`` more bytes (one read's worth at least), or to the end: a
        read returns what has arrived, often far less than asked."""
        if self._eof:
            raise ValueError("pod list ends early")
        parts, got = [self._buf[self._pos :]], 0
        while True:
            data = self._read(max(self._chunk, want - got))
            if not data:
                self._eof = True
                parts.append(self._text.decode(b"", final=True))
                break
            parts.append(self._text.decode(data))
            got += len(data)
            if got >= want:
                break
        self._buf = "".join(parts)
        self._pos = 0

    def _peek(self) -> str:
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if self._eof:
                return ""
            self._fill()

    def _expect(self, chars: str) -> str:
        ch = self._peek()
        if not ch or ch not in chars:
            raise ValueError(f"pod list: expected one of {chars!r}, got {ch or 'the end'!r}")
        self._pos += 1
        return ch

    def _value(self) -> object:
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                if self._eof:
                    raise
                self._fill(2 * (len(self._buf) - self._pos))
                continue
            if end == len(self._buf) and not self._eof and not isinstance(value, (dict, list, str)):
                self._fill()  # a number or literal may go on in the next read
                continue
            self._pos = end
            return value

    def members(self) -> Iterator[tuple[str, object]]:
        self._expect("{")
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise ValueError("pod list: a key is not a string")
            self._expect(":")
            if key == "items":
                if self._peek() != "[":
                    raise ValueError("pod list: items is not an array")
                self.saw_items = True
                self._pos += 1
                if self._peek() == "]":
                    self._pos += 1
                else:
                    while True:
                        yield key, self._value()
                        if self._expect(",]") == "]":
                            break
            else:
                yield key, self._value()
            if self._expect(",}") == "}":
                break
        if self._peek():
            raise ValueError("pod list: data after the object")


def decode_list(
    read: Callable[[int], bytes], parse: Callable[[object], T | None]
) -> tuple[list[T], str]:
    """(``parse`` of each item that parses, the list's resourceVersion) of a list answer,
    decoded item by item (:class:`_ListReader`); ValueError when it holds no ``items``
    array or no ``metadata.resourceVersion``."""
    out: list[T] = []
    version: str | None = None
    reader = _ListReader(read)
    for key, value in reader.members():
        if key == "items":
            parsed = parse(value)
            if parsed is not None:
                out.append(parsed)
        elif key == "metadata":
            version = resource_version({"metadata": value})
    if not reader.saw_items:
        raise ValueError("pod list without items")
    if version is None:
        raise ValueError("pod list without metadata.resourceVersion")
    return out, version


class ListWatch:
    """A list+watch of pods kept in its own thread: the loop :class:`PodWatcher` and the
    probe's ``KubernetesMembers`` share.

    Lists once (``resourceVersion=0``: served from the API server's cache, as client-go's
    reflector does), then watches from the list's resourceVersion with bookmarks. A watch that
    ends is resumed from the latest resourceVersion; 410 Gone (as an HTTP status or a watch
    ERROR event) relists, and so does ``resync_seconds`` after the last list (default:
    never). A failure is handed to :meth:`_failed` and backs off, doubling from
    ``backoff_initial_seconds`` to ``backoff_max_seconds``; what was listed survives it.

    A subclass says which pods (:meth:`_path`: the API path and selector), what it keeps of
    one (:meth:`_parse`, given each list item as it is decoded), what a list holds
    (:meth:`_replace`, given what ``_parse`` kept), what an event changes (:meth:`_apply`)
    and how a change of state is logged (:meth:`_state_changed`). ``what`` names the watch
    in the log, ``thread_name`` its thread.
    """

    what = "pod watch"

    def __init__(
        self,
        api_client: ClientFactory,
        settings: WatchSettings,
        *,
        thread_name: str,
        resync_seconds: float = math.inf,
    ) -> None:
        self._factory = api_client
        self._settings = settings
        self.thread_name = thread_name
        self.resync_seconds = resync_seconds
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: HttpStream | None = None
        self._state = ""
        self._lock = threading.Lock()
        self.lists_total = 0

    @property
    def healthy(self) -> bool:
        """True while the latest list or watch request succeeded."""
        return self._state == "ok"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first successful list."""
        return self._synced.wait(timeout)

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=self.thread_name, daemon=True
                )
                self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread, interrupting an open watch; what was listed stays readable."""
        self._stop.set()
        interrupt_stream(self._resp, self.what)
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- what a subclass says --------------------------------------------------------------

    def _path(self) -> tuple[str, dict[str, str]]:
        """The pods' API path and its selector parameters."""
        raise NotImplementedError

    def _parse(self, item: object) -> object | None:
        """What is kept of one listed pod (None: nothing)."""
        raise NotImplementedError

    def _replace(self, items: list[object]) -> str:
        """Take what :meth:`_parse` kept of a full list; return the "ok" state's detail."""
        raise NotImplementedError

    def _apply(self, event: object, version: str) -> str:
        """Apply one watch event; return the latest resourceVersion."""
        raise NotImplementedError

    def _failed(self, reason: str) -> None:
        """A list or watch request failed (``api_error`` or ``api_forbidden``)."""

    def _state_changed(self, state: str, detail: str, previous: str) -> None:
        """Log the new state (``ok`` or a failure reason); called on every request."""

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        s = self._settings
        api: ApiConnection | None = None
        version: str | None = None
        listed_at = -math.inf
        delay = s.backoff_initial_seconds
        while not self._stop.is_set():
            try:
                if api is None:
                    api = ApiConnection(endpoint_of(self._factory()))
                if version is None or time.monotonic() - listed_at >= self.resync_seconds:
                    version = self._list(api)
                    listed_at = time.monotonic()
                remaining = self.resync_seconds - (time.monotonic() - listed_at)
                version = self._watch(api, version, remaining)
                delay = s.backoff_initial_seconds
                continue
            except Exception as exc:  # the thread must outlive anything the client raises
                if self._stop.is_set():
                    # close() shut the stream under the read: http.client then fails in
                    # ways of its own (AttributeError on its closed file), not a fault
                    break
                outcome = classify_watch_error(exc)
                if outcome is None:
                    version = None
                    continue
                reason, detail, expected = outcome
                if not expected and self._state != reason:
                    log.exception("%s: unexpected failure", self.what)
            if self._stop.is_set():
                break
            self._failed(reason)
            self._set_state(reason, detail)
            self._stop.wait(delay)
            delay = min(delay * 2, s.backoff_max_seconds)

    def _list(self, api: ApiConnection) -> str:
        s = self._settings
        path, query = self._path()
        resp = api.get(
            path,
            {**query, "resourceVersion": "0"},
            (s.connect_timeout_seconds, s.list_timeout_seconds),
        )
        try:
            kept, version = decode_list(resp.read1, self._parse)
        finally:
            resp.release_conn()
        detail = self._replace(kept)
        self.lists_total += 1
        self._synced.set()
        self._set_state("ok", detail)
        return version

    def _watch(self, api: ApiConnection, version: str, remaining: float) -> str:
        s = self._settings
        path, query = self._path()
        timeout = max(1, math.ceil(min(s.watch_timeout_seconds, remaining)))
        resp = api.get(
            path,
            {
                **query,
                "allowWatchBookmarks": "true",
                "resourceVersion": version,
                "timeoutSeconds": str(timeout),
                "watch": "true",
            },
            (s.connect_timeout_seconds, s.read_timeout_seconds),
        )
        self._resp = resp
        self._set_state("ok", "watching")
        return consume_watch(
            resp,
            self._apply,
            version,
            stop=self._stop,
            backoff_seconds=s.backoff_initial_seconds,
            detach=self._detach,
        )

    def _detach(self) -> None:
        self._resp = None

    def _set_state(self, state: str, detail: str) -> None:
        previous, self._state = self._state, state
        self._state_changed(state, detail, previous)


class PodWatcher(ListWatch):
    """Keeps a :class:`PodIndex` of the pods on ``node_name`` current, in its own thread
    (:class:`ListWatch`). A 403 is reported to ``on_error`` as ``api_forbidden``, any other
    failure as ``api_error``. The index survives failures (it only misses changes until
    recovery).
    """

    what = "pod watch"

    def __init__(
        self,
        node_name: str,
        api_client: ClientFactory,
        on_error: Callable[[str], None],
        settings: WatchSettings = WatchSettings(),
    ) -> None:
        super().__init__(api_client, settings, thread_name=f"pod-watch-{node_name}")
        self.node_name = node_name
        self._on_error = on_error
        self._selector = f"spec.nodeName={node_name}"
        self._index: PodIndex | None = None

    @property
    def index(self) -> PodIndex | None:
        """The latest index; None until the first list succeeded."""
        return self._index

    def _path(self) -> tuple[str, dict[str, str]]:
        return "/api/v1/pods", {"fieldSelector": self._selector}

    def _parse(self, item: object) -> PodMeta | None:
        return parse_pod(item)

    def _replace(self, items: list[object]) -> str:
        self._index = PodIndex(cast("list[PodMeta]", items))
        return f"{len(self._index)} pods"

    def _apply(self, event: object, version: str) -> str:
        kind, obj = watch_event(event)
        index = self._index if self._index is not None else PodIndex()
        if kind in ("ADDED", "MODIFIED"):
            pod = parse_pod(obj)
            if pod is not None:
                self._index = index.with_pod(pod)
        elif kind == "DELETED":
            pod = parse_pod(obj)
            if pod is not None:
                self._index = index.without(pod.uid)
        return resource_version(obj) or version

    def _failed(self, reason: str) -> None:
        self._on_error(reason)

    def _state_changed(self, state: str, detail: str, previous: str) -> None:
        if state == previous:
            return
        if state == "ok":
            log.info("pod watch on node %s: ok (%s)", self.node_name, detail)
        else:
            log.warning(
                "pod watch on node %s failing: %s (%s); GPU processes of new pods stay "
                "unattributed until it recovers",
                self.node_name,
                state,
                detail,
            )
