"""What the HTTP fuzz tests share: the settings, a cheap keep-alive client, bodies as raw text.

Every endpoint gets ``CASES`` requests, each a hypothesis example, over real
HTTP to a server started as a user starts it (``tests/test_fuzz_*.py``). To
keep 10,000 cases per endpoint within CI's minutes, each case is cheap:

- one server per test, one keep-alive connection (``Http``: ``http.client``,
  a fifth of httpx's client time per request);
- ``BATCH`` cases per hypothesis example (``batched``, ``batch_of``), each sent and
  checked as if alone: hypothesis's own cost per example is shared by the batch;
- bodies are a valid wire body with a few fields replaced by raw JSON
  fragments (``Fragments``: text spliced in after ``json.dumps``, so NaN,
  numbers of 400 digits, lone surrogates and JSON nested 100,000 deep cost no
  more to send than ``0``), then sometimes damaged as bytes (truncated,
  a byte flipped, another encoding); drawing from lists is much cheaper
  than hypothesis's recursive JSON, which gets a small share;
- ``SETTINGS``: derandomized (the same cases in every run, on every machine:
  a failure in CI is one a developer sees too), no example database, no
  deadline (the box is shared; a slow case is not a failure, a hang is: the
  client's socket timeout ends it).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

CASES = int(os.environ.get("POWERFLOW_FUZZ_CASES", "10000"))
"""Requests per endpoint (``POWERFLOW_FUZZ_CASES`` runs more, or fewer while developing)."""

SETTINGS = settings(
    max_examples=CASES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)

BATCH = 20
"""Cases per hypothesis example: hypothesis's own cost per example is shared by the
batch's cases (the four fuzz files took 148 s of CPU one case an example, 126 s twenty:
docs/verification.md, "Fuzzing every HTTP endpoint"). The cases are the strategy's draws
either way, and a failing batch shrinks case by case. Each case's requests still go out
on their own: pipelined across cases, uvicorn's answer to a request its parser refuses
came ahead of the answers to the requests before it."""


def batched(cases: int = CASES) -> settings:
    """``SETTINGS`` for ``cases`` cases, ``BATCH`` an example (``batch_of``)."""
    return settings(SETTINGS, max_examples=max(1, -(-cases // BATCH)))


def batch_of(case: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """``BATCH`` cases drawn from ``case``: one example."""
    return st.lists(case, min_size=BATCH, max_size=BATCH)


HANG_S = 60.0
"""A request unanswered this long is a hang (the failure), not a slow answer."""

FUZZ_TIMEOUT = pytest.mark.timeout(600)
"""600 s for a fuzz test: 10,000 cases take a minute or two on a 2-core box
(docs/verification.md); the suite's 120 s per test would end a run on a slower one. A hung
request fails within ``HANG_S`` anyway."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.status} {self.body[:300]!r}"


class Http:
    """One keep-alive HTTP/1.1 connection to ``127.0.0.1:port``, reopened when the server
    closes it (after a refused body, or ``Connection: close``)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn: http.client.HTTPConnection | None = None
        self.sent = 0

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HANG_S)
        return self._conn

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        *,
        chunked: bool = False,
    ) -> Answer:
        """Send one request; a connection the server closed since the last one is reopened
        once (never for a timeout: that is a hang)."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                return self._exchange(conn, method, path, body, headers or {}, chunked)
            except TimeoutError:
                raise AssertionError(f"{method} {path}: no answer in {HANG_S} s") from None
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        chunked: bool,
    ) -> Answer:
        try:
            if chunked:
                conn.putrequest(method, path, skip_accept_encoding=True)
                for key, value in headers.items():
                    conn.putheader(key, value)
                conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders(_chunks(body or b""), encode_chunked=True)
            else:
                conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # The server answered and closed before taking the whole body (a body over its
            # limit): its answer may still be there to read.
            pass
        response = conn.getresponse()
        data = response.read()
        answer = Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        self.sent += 1
        if response.will_close:
            self.close()
        return answer


Request = tuple[str, str, bytes | None, dict[str, str]]
"""Method, path, body (None: none), headers: one request of ``Pipeline.send``."""


def raw_request(request: Request, port: int) -> bytes:
    """``request`` as ``http.client`` writes it: ``Host``, ``Accept-Encoding: identity``
    unless given, the headers (Latin-1), ``Content-Length`` for a body (0 for a POST,
    PUT or PATCH without one)."""
    method, path, body, headers = request
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if not any(k.lower() == "accept-encoding" for k in headers):
        lines.append("Accept-Encoding: identity")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + (body or b"")


class _Kept:
    """The connection's reader, shared by the answers read from it in turn: closing one
    answer (``HTTPResponse`` does once its body is read) leaves it open for the next."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def makefile(self, *_: Any, **__: Any) -> _Kept:
        return self

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class Pipeline:
    """One keep-alive HTTP/1.1 connection to ``127.0.0.1:port`` on which a batch of
    requests goes out back to back and their answers come back in order (pipelining,
    RFC 9112 section 9.3): one round trip a batch, where ``Http`` takes one a request.
    The server answers each as if it came alone; when it closes the connection after
    one (a refused request, ``Connection: close``), the requests it did not answer go
    again on a new connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._sock: socket.socket | None = None
        self._reader: _Kept | None = None
        self.sent = 0

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._reader = None

    def _connection(self) -> tuple[socket.socket, _Kept]:
        if self._sock is None or self._reader is None:
            self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=HANG_S)
            self._reader = _Kept(self._sock.makefile("rb"))
        return self._sock, self._reader

    def send(self, requests: Sequence[Request]) -> list[Answer]:
        """The answers to ``requests``, in their order."""
        answers: list[Answer] = []
        pending = list(requests)
        while pending:
            new = self._sock is None
            sock, reader = self._connection()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                # If it closed, the answers it sent before may still be there to read.
                sock.sendall(b"".join(raw_request(r, self.port) for r in pending))
            done, closing = self._read(reader, pending, answers)
            pending = pending[done:]
            if closing:
                self.close()
            if done == 0 and new:
                method, path, _, _ = pending[0]
                raise AssertionError(f"{method} {path}: the connection closed unanswered")
        return answers

    def _read(
        self, reader: _Kept, pending: list[Request], answers: list[Answer]
    ) -> tuple[int, bool]:
        """Read answers to ``pending`` in order into ``answers``: how many, and whether
        the server closes the connection after the last."""
        done = 0
        for method, path, _, _ in pending:
            response = http.client.HTTPResponse(reader, method=method)  # type: ignore[arg-type]
            try:
                response.begin()
                data = response.read()
            except TimeoutError:
                raise AssertionError(f"{method} {path}: no answer in {HANG_S} s") from None
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                return done, True
            headers = {k.lower(): v for k, v in response.getheaders()}
            answers.append(Answer(response.status, headers, data))
            self.sent += 1
            done += 1
            if response.will_close:
                return done, True
        return done, False


def _chunks(body: bytes, size: int = 1 << 16) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


# -- bodies as raw text ---------------------------------------------------------------------

DEEP = 100_000
"""Deeper than any decoder's recursion limit (orjson stops at 1,024, the stdlib at ~1,000)."""

NASTY: tuple[str, ...] = (
    "null", "true", "false", "0", "-0", "1", "-1", "8", "0.5", "-0.0", "1e-400",
    "4096", "2147483648", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "-9223372036854775809", "1" + "0" * 400, "-" + "9" * 400,
    "1e308", "1e309", "-1e309", "1.7976931348623157e308", "NaN", "Infinity", "-Infinity",
    '""', '" "', '"0"', '"1"', '"4"', '" 2 "', '"-1"', '"1e309"', '"NaN"', '"Infinity"',
    '"' + "1" + "0" * 400 + '"', '"\\ud800"', '"\\udfff\\ud800"', '"a\\u0000b"', '"\\n"',
    '"n1"', '"gpu-0"', '"default"', '"../../x"', '"a/b?c#d"', '"%2F"', '"\u00e9\u4e2d\U0001f600"',
    '"' + "x" * 300 + '"', '"' + "a" * 70_000 + '"',
    "[]", "{}", "[null]", '[""]', "[1,2]", '{"":null}', '{"a":{"b":{"c":[]}}}',
    '{"metadata":{"name":"gpu-0"}}', '[{"metadata":{"name":"gpu-0"}}]',
    "[" * 200 + "]" * 200, "[" * 2000 + "]" * 2000, '{"a":' * 2000 + "1" + "}" * 2000,
    "[" * DEEP + "]" * DEEP, "[" * 900 + "]" * 900, "[1" + ",1" * 20_000 + "]",
)  # fmt: skip
"""Raw JSON texts that broke readers somewhere: overflowing and non-finite numbers, numeric
strings, lone surrogates, NUL, path characters, very long strings, deep and wide nesting."""

_scalar = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
)
_small_json = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def dumps(value: Any) -> str:
    """``json.dumps`` as a sloppy client writes it: NaN and Infinity allowed."""
    return json.dumps(value, allow_nan=True)


fragments = st.one_of(
    st.sampled_from(NASTY),
    st.sampled_from(NASTY),
    _scalar.map(dumps),
    _small_json.map(dumps),
)
"""One raw JSON value (or a text that is almost one)."""

MARK = "@@fuzz{}@@"


Path = tuple[str | int, ...]


def splice(body: Any, edits: Sequence[tuple[Path, str | None]]) -> str:
    """``body`` as JSON text with the value at each path replaced by a raw fragment
    (``None``: the key removed). A path through something that is no longer an object or
    list (an earlier edit replaced it) is skipped."""
    body = json.loads(json.dumps(body))
    spliced: dict[str, str] = {}
    for i, (path, fragment) in enumerate(edits):
        parent = body
        for step in path[:-1]:
            parent = _child(parent, step)
            if parent is None:
                break
        last = path[-1]
        if isinstance(parent, dict) and isinstance(last, str):
            if fragment is None:
                parent.pop(last, None)
                continue
            mark = MARK.format(i)
            parent[last] = mark
            spliced[json.dumps(mark)] = fragment
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            if fragment is None:
                del parent[last]
                continue
            mark = MARK.format(i)
            parent[last] = mark
            spliced[json.dumps(mark)] = fragment
    text = json.dumps(body)
    for mark, fragment in spliced.items():
        text = text.replace(mark, fragment, 1)
    return text


def _child(parent: Any, step: str | int) -> Any:
    if isinstance(parent, dict) and isinstance(step, str):
        return parent.get(step)
    if isinstance(parent, list) and isinstance(step, int) and step < len(parent):
        return parent[step]
    return None


DAMAGE = ("utf-8",) * 6 + ("cut", "flip", "tail", "bom", "utf-16", "latin-1")
TAILS = (b",", b"}", b"]]", b"\x00", b"\xff", b" {}", b"\n")


def damage(text: str, how: str, at: int, byte: int) -> bytes:
    """``text``'s bytes as they are (``utf-8``), or broken the ways a client breaks them:
    cut at ``at``, a byte flipped there, junk appended, a BOM, another encoding."""
    raw = text.encode("utf-8", "surrogatepass")
    at %= max(1, len(raw))
    if how == "cut":
        return raw[:at]
    if how == "flip":
        return raw[:at] + bytes([byte]) + raw[at + 1 :]
    if how == "tail":
        return raw + TAILS[byte % len(TAILS)]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "utf-16":
        return text.encode("utf-16", "surrogatepass")
    if how == "latin-1":
        return text.encode("latin-1", "replace")
    return raw


_KINDS = ("mutated",) * 6 + ("fragment", "bytes")


def bodies(bases: Sequence[Any], paths: Sequence[Path]) -> st.SearchStrategy[bytes]:
    """Well-formed bodies (one of ``bases``) with up to three fields replaced by a fragment
    or removed, then maybe damaged (most); a fragment alone; arbitrary bytes.

    One composite of flat draws: ``flatmap`` and nested ``one_of`` cost hypothesis several
    times more per example, and the cases are the same."""
    base_at = st.integers(0, len(bases) - 1)
    path_at = st.integers(0, len(paths) - 1)
    edit = st.tuples(path_at, fragments | st.none())

    @st.composite
    def draw_body(draw: st.DrawFn) -> bytes:
        kind = draw(st.sampled_from(_KINDS))
        if kind == "bytes":
            return draw(st.binary(max_size=80))
        if kind == "fragment":
            return draw(fragments).encode("utf-8", "surrogatepass")
        changes = draw(st.lists(edit, max_size=3))
        text = splice(bases[draw(base_at)], [(paths[i], f) for i, f in changes])
        how = draw(st.sampled_from(DAMAGE))
        if how == "utf-8":
            return text.encode("utf-8", "surrogatepass")
        return damage(text, how, draw(st.integers(0, 1 << 20)), draw(st.integers(0, 255)))

    return draw_body()


content_types = st.sampled_from(
    [None, "application/json", "application/json", "application/json", "application/json",
     "application/json; charset=utf-8", "application/merge-patch+json", "APPLICATION/JSON",
     "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     "application/octet-stream", "application/jsonx", "json", "", ";", "application/",
     "\u00e9/json", "application/json; charset=utf-16"]
)  # fmt: skip
"""Content-Type headers a client sends (``None``: none)."""


MALFORMED: tuple[bytes, ...] = (
    b"GARBAGE\r\n\r\n",
    b"POST {path} HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\n{",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n0\r\n\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nBad Header\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nX: \xff\xfe\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path}\xff HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
)
"""Requests no HTTP client library sends: what a server must refuse with a 4xx (or, where its
HTTP parser gives up on the connection, close it), whole requests all."""

CUT_SHORT: tuple[bytes, ...] = (
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
    b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n"
    b"\r\n\x1f\x8b",
)
"""Bodies the client stops sending halfway, then hangs up (``raw_status(hang_up=True)``)."""


def raw_status(port: int, request: bytes, *, hang_up: bool = False) -> int | None:
    """Send ``request`` as it is (then close the sending side if ``hang_up``) and read the
    status of the final answer (``None``: the server closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as sock:
        sock.sendall(request)
        if hang_up:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        try:
            while True:
                while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:
                    data = data.partition(b"\r\n\r\n")[2]  # past 100 Continue
                if b"\r\n" in data:
                    break
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise AssertionError(f"no answer in {HANG_S} s to {request[:80]!r}") from None
        except ConnectionResetError:
            pass
    if not data:
        return None
    line = data.split(b"\r\n", 1)[0].split()
    assert len(line) >= 2 and line[0].startswith(b"HTTP/"), data[:200]
    return int(line[1])
