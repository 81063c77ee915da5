"""A TCP proxy that injects network faults between Kafka clients and a broker (`sparkeos chaos` and the tests).

Clients connect to the proxy, which forwards every byte to the broker and back. It follows the Kafka framing in
both directions (a size prefix, then the request header with API key and correlation id, or the response header
with the correlation id), so faults can aim at one API:

- `cut_all()` drops every open connection at once.
- `cut_after_request_probability` sometimes forwards a chunk of a request and then drops the connection before
  any of the broker's answer reaches the client; `cut_requests(api_key, count)` does the same to the next
  `count` requests of one API, whichever connection carries them. Either way the client cannot know whether
  its request was applied and must retry it.
- `drop_answers(api_key, count)` lets the next `count` requests of one API reach the broker and withholds the
  broker's answer to each, which proves the broker handled the request; then the connection is cut, or kept
  open and silent until the client gives up on it, or kept going with only that answer missing.
- `refuse_for(seconds)` cuts every connection and refuses new ones for a while, as a broker that is down.
- `delay(seconds)` holds every chunk that long before passing it on, per direction, in order.
- `split_frames` passes bytes on in small random pieces with short pauses, so that both ends see requests and
  answers arrive a few bytes at a time.

For another protocol (`kafka_framing=False`, PostgreSQL's), two faults aim at what a client sends:
`withhold_answer_after(pattern)` lets a chunk holding `pattern` through and withholds the server's answer, and
`cut_within(pattern)` breaks off the client's next chunk after one holding `pattern`.

Every fault is counted (`counters()`), so a test can assert that the fault it meant to inject did happen.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

CHUNK = 65536
REQUEST_HEADER = 12  # size, api key, api version, correlation id
RESPONSE_HEADER = 8  # size, correlation id

# What happens to a connection once an answer on it is withheld (see `drop_answers`).
CUT = "cut"
SILENCE = "silence"
CONTINUE = "continue"
DROP_MODES = (CUT, SILENCE, CONTINUE)

_CLOSE = object()  # queued after the last bytes of a direction: close the link once they are sent


@dataclass
class _Frame:
    size: int
    api_key: int | None = None
    correlation_id: int | None = None


class _Framer:
    """Splits one direction's byte stream at Kafka frame boundaries. `feed` returns (frame, piece, first) for
    each piece of the chunk, where `piece` lies within `frame` and `first` says it starts the frame; a frame's
    header is always complete in the piece that starts it, so bytes of an incomplete header wait for the next
    chunk."""

    def __init__(self, header_size: int) -> None:
        self.header_size = header_size
        self.frame: _Frame | None = None
        self.left = 0  # bytes of `frame` still to come
        self.pending = b""

    def feed(self, data: bytes) -> list[tuple[_Frame, bytes, bool]]:
        if self.pending:
            data, self.pending = self.pending + data, b""
        pieces = []
        position = 0
        while position < len(data):
            if self.left:
                step = min(self.left, len(data) - position)
                pieces.append((self.frame, data[position : position + step], False))
                self.left -= step
                position += step
                continue
            available = len(data) - position
            if available < 4:
                self.pending = data[position:]
                break
            size = int.from_bytes(data[position : position + 4], "big", signed=True)
            if size < 0:  # not Kafka: pass the rest through as one piece
                frame = _Frame(size=0)
                pieces.append((frame, data[position:], True))
                break
            header = min(self.header_size, 4 + size)
            if available < header:
                self.pending = data[position:]
                break
            frame = _Frame(size=size)
            if self.header_size == REQUEST_HEADER and header == REQUEST_HEADER:
                frame.api_key = int.from_bytes(data[position + 4 : position + 6], "big", signed=True)
                frame.correlation_id = struct.unpack_from(">i", data, position + 8)[0]
            elif self.header_size == RESPONSE_HEADER and header == RESPONSE_HEADER:
                frame.correlation_id = struct.unpack_from(">i", data, position + 4)[0]
            self.frame = frame
            self.left = 4 + size
            step = min(self.left, len(data) - position)
            pieces.append((frame, data[position : position + step], True))
            self.left -= step
            position += step
        return pieces


class _Pipe:
    """One direction of a link: chunks queued for one socket, sent in order by a thread of its own, each no
    earlier than its arrival plus the proxy's delay for this direction."""

    def __init__(self, proxy: TcpProxy, link: _Link, sock: socket.socket, direction: str) -> None:
        self.proxy = proxy
        self.link = link
        self.sock = sock
        self.direction = direction
        self.items: deque[tuple[float, object]] = deque()
        self.condition = threading.Condition()
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=f"tcp-proxy-{direction}", daemon=True)

    def put(self, data: object) -> None:
        latency = self.proxy._delays[self.direction]
        if latency > 0 and data is not _CLOSE:
            self.proxy._count("chunks_delayed")
        with self.condition:
            self.items.append((time.monotonic() + latency, data))
            self.condition.notify()

    def drain(self, timeout: float) -> None:
        """Wait until everything queued so far has been sent (or the link closed)."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while (self.items or self.busy) and not self.link.closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.condition.wait(min(left, 0.05))

    def _run(self) -> None:
        try:
            while not self.link.closed.is_set():
                with self.condition:
                    while not self.items and not self.link.closed.is_set():
                        self.condition.wait(0.1)
                    if self.link.closed.is_set():
                        return
                    due, data = self.items.popleft()
                    self.busy = True
                wait = due - time.monotonic()
                if wait > 0 and self.link.closed.wait(wait):
                    return
                if data is _CLOSE:
                    self.proxy._drop(self.link)
                    return
                assert isinstance(data, bytes)
                if self.proxy.split_frames:
                    self._send_split(data)
                else:
                    self.sock.sendall(data)
                with self.condition:
                    self.busy = False
                    self.condition.notify_all()
        except OSError:
            self.proxy._drop(self.link)
        finally:
            with self.condition:
                self.busy = False
                self.condition.notify_all()

    def _send_split(self, data: bytes) -> None:
        proxy = self.proxy
        position = 0
        while position < len(data):
            with proxy._lock:
                step = proxy.rng.randint(1, proxy.split_max_bytes)
                pause = proxy.rng.random() < proxy.split_pause_probability
            self.sock.sendall(data[position : position + step])
            position += step
            proxy._count("pieces_sent")
            if pause and position < len(data):
                time.sleep(proxy.split_pause_s)
        proxy._count("chunks_split")


class _Link:
    """One client connection and its connection to the broker."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.muted = threading.Event()  # set: broker bytes are dropped instead of forwarded
        self.closed = threading.Event()
        self.requests = _Framer(REQUEST_HEADER)
        self.answers = _Framer(RESPONSE_HEADER)
        self.withheld: dict[int, tuple[str, int]] = {}  # correlation id -> (drop mode, api key) of an answer
        self.dropping: _Frame | None = None  # the answer whose bytes are being dropped
        self.withhold_next_answer = False  # `withhold_answer_after`: the server's next bytes are dropped, then a cut
        self.cut_next_request = False  # `cut_within`: the client's next chunk is passed on in part, then a cut
        self.to_broker = _Pipe(proxy, self, upstream, "to_broker")
        self.to_client = _Pipe(proxy, self, client, "to_client")

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass


class TcpProxy:
    def __init__(self, target_host: str = "127.0.0.1", target_port: int = 0, listen_host: str = "127.0.0.1",
                 seed: int = 0, cut_after_request_probability: float = 0.0, split_frames: bool = False,
                 split_max_bytes: int = 16, split_pause_s: float = 0.0005,
                 split_pause_probability: float = 0.25, kafka_framing: bool = True) -> None:
        self.target = (target_host, target_port)
        # Off for another protocol (PostgreSQL's): bytes pass as they come, and only the faults that know no
        # framing apply (cut_all, refuse_for, delay, split_frames, withhold_answer_after, cut_within).
        self.kafka_framing = kafka_framing
        self.rng = random.Random(seed)
        self.cut_after_request_probability = cut_after_request_probability
        # Forward bytes in pieces of 1..split_max_bytes, pausing split_pause_s after some of them.
        self.split_frames = split_frames
        self.split_max_bytes = split_max_bytes
        self.split_pause_s = split_pause_s
        self.split_pause_probability = split_pause_probability
        self.cuts = 0  # connections dropped by cut_all and refuse_for
        self.cuts_after_request = 0
        self.accepted = 0
        self._counters: Counter[str] = Counter()
        self._requests_by_api: Counter[int] = Counter()
        self._answers_dropped_by_api: Counter[int] = Counter()
        self._cuts_by_api: dict[int, int] = {}  # api key -> requests still to cut
        self._drops_by_api: dict[int, deque[str]] = {}  # api key -> drop modes of the answers still to drop
        self._delays = {"to_broker": 0.0, "to_client": 0.0}
        self._refuse_until = 0.0
        self._refuse_reset = False
        self._answers_after: list[bytes] = []  # patterns of `withhold_answer_after`, one entry per use
        self._cuts_within: list[bytes] = []  # patterns of `cut_within`, one entry per use
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_host, 0))
        self._listener.listen(64)
        self.host, self.port = self._listener.getsockname()[:2]
        self._stopped = threading.Event()
        self._acceptor: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        self._acceptor = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close() alone does not
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        self.cut_all()
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------------

    def cut_all(self) -> int:
        """Drop every open connection; returns how many were dropped."""
        with self._lock:
            links = list(self._links)
            self._links.clear()
            self.cuts += len(links)
        for link in links:
            link.close()
        return len(links)

    def cut_requests(self, api_key: int, count: int = 1) -> None:
        """Forward the next `count` requests of `api_key` to the broker, and drop their connections before any
        answer reaches the client."""
        with self._lock:
            self._cuts_by_api[api_key] = self._cuts_by_api.get(api_key, 0) + count

    def requests_left_to_cut(self, api_key: int) -> int:
        with self._lock:
            return self._cuts_by_api.get(api_key, 0)

    def drop_answers(self, api_key: int, count: int = 1, then: str = CUT) -> None:
        """Let the next `count` requests of `api_key` (on any connection) reach the broker, and withhold the
        broker's answer to each. Unlike `cut_requests`, the proxy waits for the answer, so the broker has
        handled the request. Then, by `then`:

        - "cut": the connection is closed when the answer arrives, so answers to other requests still in flight
          on it are lost too (only the withheld ones are counted in `answers_dropped`);
        - "silence": the connection stays open but nothing more reaches the client on it, until the client's
          request timeout makes it close the connection;
        - "continue": only that answer is missing; later answers on the connection still pass.
        """
        if then not in DROP_MODES:
            raise ValueError(f"then must be one of {DROP_MODES}, got {then!r}")
        with self._lock:
            self._drops_by_api.setdefault(api_key, deque()).extend([then] * count)

    def answers_left_to_drop(self, api_key: int) -> int:
        """Requests of `api_key` still to be picked by `drop_answers` (not counting ones whose answer is awaited)."""
        with self._lock:
            return len(self._drops_by_api.get(api_key, ()))

    def withhold_answer_after(self, pattern: bytes, count: int = 1) -> None:
        """For any protocol: the next `count` client chunks that contain `pattern` (say b"PREPARE TRANSACTION")
        reach the server; the server's next bytes on that connection are withheld, and the connection cut."""
        with self._lock:
            self._answers_after.extend([pattern] * count)

    def cut_within(self, pattern: bytes, count: int = 1) -> None:
        """For any protocol: after each of the next `count` client chunks that contain `pattern` (say b"COPY"),
        the client's next chunk on that connection reaches the server only in part, and the connection is cut:
        a stream such as COPY's data broken off in the middle."""
        with self._lock:
            self._cuts_within.extend([pattern] * count)

    def clear_faults(self) -> None:
        """Withdraw every armed fault that has not taken effect yet: cuts and drops still to pick, latency, split
        frames and a window of refused connections. Faults under way (an answer awaited to be withheld) finish."""
        with self._lock:
            self._cuts_by_api.clear()
            self._drops_by_api.clear()
            self._answers_after.clear()
            self._cuts_within.clear()
            self._refuse_until = 0.0
        self.delay(0)
        self.split_frames = False

    def refuse_for(self, seconds: float, reset: bool = False) -> int:
        """Cut every open connection and, for `seconds` from now, close each new connection as soon as it is
        accepted (with `reset`, by a TCP reset instead of an orderly close). Returns at once; returns how many
        connections were cut."""
        with self._lock:
            self._refuse_until = max(self._refuse_until, time.monotonic() + seconds)
            self._refuse_reset = reset
        self._count("refusals")
        return self.cut_all()

    def refusing(self) -> bool:
        with self._lock:
            return time.monotonic() < self._refuse_until

    def delay(self, seconds: float, direction: str = "both") -> None:
        """Hold every chunk `seconds` before passing it on, keeping the order: "to_broker" (requests),
        "to_client" (answers) or "both". 0 turns it off; chunks already held keep their time."""
        directions = ("to_broker", "to_client") if direction == "both" else (direction,)
        for name in directions:
            if name not in self._delays:
                raise ValueError(f"direction must be to_broker, to_client or both, got {direction!r}")
            self._delays[name] = max(0.0, seconds)

    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    def counters(self) -> dict[str, int]:
        """How often each fault acted so far: connections accepted, cut (`cuts`: by cut_all and refuse_for;
        `cuts_after_request`: by cut_requests and the random cut), `answers_dropped`, `connections_refused`,
        `refusals` (calls of refuse_for), `chunks_delayed`, `chunks_split`, `pieces_sent`, and of the pattern faults
        `answers_withheld` and `cuts_within`."""
        with self._lock:
            return {
                "accepted": self.accepted,
                "cuts": self.cuts,
                "cuts_after_request": self.cuts_after_request,
                **{name: self._counters[name] for name in ("answers_dropped", "connections_refused", "refusals",
                                                             "chunks_delayed", "chunks_split", "pieces_sent",
                                                             "answers_withheld", "cuts_within")},
            }

    def requests_seen(self, api_key: int) -> int:
        """Requests of `api_key` forwarded to the broker so far."""
        with self._lock:
            return self._requests_by_api[api_key]

    def answers_dropped(self, api_key: int | None = None) -> int:
        with self._lock:
            if api_key is None:
                return self._counters["answers_dropped"]
            return self._answers_dropped_by_api[api_key]

    # -- forwarding --------------------------------------------------------------------------

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[name] += amount

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse, reset = time.monotonic() < self._refuse_until, self._refuse_reset
                if refuse:
                    self._counters["connections_refused"] += 1
            if refuse:
                if reset:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.add(link)
                self.accepted += 1
            link.to_broker.thread.start()
            link.to_client.thread.start()
            threading.Thread(target=self._pump_requests, args=(link,), name="tcp-proxy-requests",
                             daemon=True).start()
            threading.Thread(target=self._pump_responses, args=(link,), name="tcp-proxy-answers",
                             daemon=True).start()

    def _drop(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)
        link.close()

    def _pump_requests(self, link: _Link) -> None:
        try:
            while True:
                data = link.client.recv(CHUNK)
                if not data:
                    break
                cut = False
                with self._lock:
                    if self.cut_after_request_probability and self.rng.random() < self.cut_after_request_probability:
                        cut = True
                    if link.cut_next_request:
                        self._counters["cuts_within"] += 1
                        data, cut = data[: max(1, len(data) // 2)], True
                    self._match_patterns(link, data)
                    for frame, _piece, first in link.requests.feed(data) if self.kafka_framing else ():
                        if not first or frame.api_key is None:
                            continue
                        self._requests_by_api[frame.api_key] += 1
                        if self._cuts_by_api.get(frame.api_key, 0) > 0:
                            self._cuts_by_api[frame.api_key] -= 1
                            cut = True
                        modes = self._drops_by_api.get(frame.api_key)
                        if modes and frame.correlation_id is not None:
                            link.withheld[frame.correlation_id] = (modes.popleft(), frame.api_key)
                if cut:
                    # The broker gets the bytes; the client never hears back.
                    link.muted.set()
                    link.to_broker.put(data)
                    link.to_broker.drain(5)
                    time.sleep(0.02)  # let the broker act on it before the connection goes
                    with self._lock:
                        self.cuts_after_request += 1
                    break
                link.to_broker.put(data)
        except OSError:
            pass
        link.to_broker.drain(5)
        self._drop(link)

    def _match_patterns(self, link: _Link, data: bytes) -> None:
        """Arm the link for `withhold_answer_after` and `cut_within` (called with the lock held)."""
        for patterns, flag in ((self._answers_after, "withhold_next_answer"), (self._cuts_within, "cut_next_request")):
            for index, pattern in enumerate(patterns):
                if pattern in data:
                    del patterns[index]
                    setattr(link, flag, True)
                    break

    def _pump_responses(self, link: _Link) -> None:
        try:
            while True:
                data = link.upstream.recv(CHUNK)
                if not data:
                    break
                if link.muted.is_set():
                    continue
                if link.withhold_next_answer:
                    self._count("answers_withheld")
                    link.muted.set()
                    link.to_client.put(_CLOSE)
                    return
                if not self.kafka_framing:
                    link.to_client.put(data)
                    continue
                forward = []
                cut = False
                for frame, piece, first in link.answers.feed(data):
                    if first:
                        with self._lock:
                            withheld = link.withheld.pop(frame.correlation_id, None) if link.withheld else None
                            mode = None
                            if withheld is not None:
                                mode, api_key = withheld
                                self._counters["answers_dropped"] += 1
                                self._answers_dropped_by_api[api_key] += 1
                        if mode is not None:
                            link.dropping = frame
                            if mode == CUT:
                                cut = True
                                break
                            if mode == SILENCE:
                                link.muted.set()
                                break
                        else:
                            link.dropping = None
                    if frame is not link.dropping:
                        forward.append(piece)
                if forward:
                    link.to_client.put(b"".join(forward))
                if cut:
                    link.muted.set()
                    link.to_client.put(_CLOSE)
                    return
        except OSError:
            pass
        # The broker closed the connection: the client gets what was already on its way, then the close.
        link.to_client.put(_CLOSE)
