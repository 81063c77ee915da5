"""A TCP proxy for tests that cuts client connections at chosen or random moments.

Clients connect to the proxy, which forwards every byte to the broker and back. `cut_all()`
drops every connection at once; with `cut_after_request_probability` the proxy sometimes
forwards a chunk of a request to the broker and then drops the connection before any of the
broker's answer reaches the client, the case where a client cannot know whether its request
was applied and must retry it. `cut_requests(api_key, count)` does the same to the next `count`
requests of one Kafka API, whichever connection carries them.
"""

from __future__ import annotations

import random
import socket
import threading
import time

CHUNK = 65536


class _Link:
    """One client connection and its connection to the broker."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.muted = threading.Event()  # set: broker bytes are dropped instead of forwarded
        self.closed = threading.Event()
        self.request_bytes_left = 0  # of the request whose bytes are being forwarded
        self.partial_size = b""  # the start of a request's size prefix that ended a chunk

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
                 seed: int = 0, cut_after_request_probability: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.rng = random.Random(seed)
        self.cut_after_request_probability = cut_after_request_probability
        self.cuts = 0
        self.cuts_after_request = 0
        self.accepted = 0
        self._cuts_by_api: dict[int, int] = {}  # api key -> requests still to cut
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

    def cut_all(self) -> int:
        """Drop every open connection; returns how many were dropped."""
        with self._lock:
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close()
        self.cuts += len(links)
        return len(links)

    def cut_requests(self, api_key: int, count: int = 1) -> None:
        """Forward the next `count` requests of `api_key` to the broker, and drop their connections before any
        answer reaches the client."""
        with self._lock:
            self._cuts_by_api[api_key] = self._cuts_by_api.get(api_key, 0) + count

    def requests_left_to_cut(self, api_key: int) -> int:
        with self._lock:
            return self._cuts_by_api.get(api_key, 0)

    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- forwarding --------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self._lock:
                self._links.add(link)
                self.accepted += 1
            threading.Thread(target=self._pump_requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._pump_responses, args=(link,), daemon=True).start()

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
                with self._lock:
                    cut = self.rng.random() < self.cut_after_request_probability or self._cut_by_api(link, data)
                if cut:
                    # The broker gets the bytes; the client never hears back.
                    link.muted.set()
                    link.upstream.sendall(data)
                    time.sleep(0.02)  # let the broker act on it before the connection goes
                    self.cuts_after_request += 1
                    break
                link.upstream.sendall(data)
        except OSError:
            pass
        self._drop(link)

    def _cut_by_api(self, link: _Link, data: bytes) -> bool:
        """Whether `data` starts a request whose API is to be cut; follows the request framing (called with the
        lock held)."""
        cut = False
        position = 0
        if link.partial_size:
            data = link.partial_size + data
            link.partial_size = b""
        while position < len(data):
            if link.request_bytes_left:
                step = min(link.request_bytes_left, len(data) - position)
                link.request_bytes_left -= step
                position += step
                continue
            if len(data) - position < 6:
                link.partial_size = data[position:]
                break
            size = int.from_bytes(data[position : position + 4], "big")
            api_key = int.from_bytes(data[position + 4 : position + 6], "big")
            if self._cuts_by_api.get(api_key, 0) > 0:
                self._cuts_by_api[api_key] -= 1
                cut = True
            link.request_bytes_left = size
            position += 4
        return cut

    def _pump_responses(self, link: _Link) -> None:
        try:
            while True:
                data = link.upstream.recv(CHUNK)
                if not data:
                    break
                if link.muted.is_set():
                    continue
                link.client.sendall(data)
        except OSError:
            pass
        self._drop(link)
