"""Plumbing shared by the local cloud fakes (tests/gcp.py, tests/azure.py): their base class
(`FakeCloud`: the lock, the counts, the server and the executor thread, and how they stop), a
threaded HTTP or HTTPS server on 127.0.0.1 that hands every request to one callback and writes its
JSON answer, a throwaway certificate authority for the HTTPS case, and how their executors start,
watch and kill the local processes that play cloud jobs."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import psutil

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query, not percent-decoded
    query: dict[str, list[str]]  # parse_qs of the query (blank values dropped)
    body: bytes
    headers: Message


# (status, JSON payload or None for an empty body, extra response headers)
Answer = tuple[int, Any, dict[str, str]]


class Server(ThreadingHTTPServer):
    """Serves `respond(Request) -> Answer` on 127.0.0.1 (a free port) from a daemon thread, one
    thread per connection, HTTP/1.1 keep-alive; HTTPS when given an SSL context (the handshake runs
    in the connection's own thread). `url` is where it listens; `stop()` ends it and its connections."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, respond: Callable[[Request], Answer], *, name: str, tls: ssl.SSLContext | None = None):
        self.respond = respond
        self.tls = tls
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port: int = self.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
        self._thread.start()

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10)  # a client that never finishes the handshake does not hold the thread for ever
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ValueError):
            return
        conn.settimeout(None)
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (OSError, ValueError)):
            return  # a client that went away, or a connection stop() cut
        super().handle_error(request, client_address)

    def stop(self) -> None:
        """Stop serving, cut the kept-alive connections (their threads would serve on), close the port."""
        self.shutdown()
        with self.conns_lock:
            for s in list(self.conns):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.server_close()
        self._thread.join(10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDKs reuse connections
    server: Server

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK cost 40 ms a call
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.conns_lock:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.conns_lock:
            self.server.conns.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, payload, headers = self.server.respond(Request(self.command, parts.path, parse_qs(parts.query), body, self.headers))
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve


class FakeCloud:
    """What the cloud fakes share: one lock for their state, the counts every fake keeps, a server
    that hands each request to `_respond`, and an executor thread that plays each active execution
    (`_step`) until it ends. A context manager: its exit (`close`) stops them and kills every
    process group still running."""

    label = "fake cloud"  # how the executor names itself on stderr

    def __init__(self, *, seed: int | None = None) -> None:
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.rng = random.Random(seed)
        self.faults = 0
        self.requests: list[tuple[float, str, str]] = []  # (monotonic time, method, path without query)
        self.runs: dict[str, int] = {}  # CONTROLPLANE_JOB_NAME (default: the job's name) -> processes started
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # execution name -> process
        self._executions: dict[str, Any] = {}  # the fake's own key -> execution (forgotten ones removed)
        self._active: set[str] = set()  # keys of the executions with a process to play, not ended yet
        # Prefixes of this host's variables a job's process does not inherit (e.g. its cloud credentials).
        self.hidden_env: tuple[str, ...] = ()
        # How an execution's process starts: `start_process`'s contract (tests/forkserver.py forks
        # `python -m` commands from a preloaded interpreter instead).
        self.spawn: Callable[[list[str], dict[str, str], tuple[str, ...]], Any] = start_process

    def _serve(self, name: str, tls: ssl.SSLContext | None = None) -> None:
        """Start serving `_respond` on `url` and playing executions: the end of a fake's __init__."""
        self._server = Server(self._respond, name=f"{name}-http", tls=tls)
        self.port = self._server.port
        self.url = self._server.url
        self._executor = threading.Thread(target=self._loop, name=f"{name}-executor", daemon=True)
        self._executor.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving, stop the executor, SIGKILL every process group still running."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._server.stop()
        self._executor.join(10)
        for proc in list(self.processes.values()):
            reap(proc)

    def finish(self, name: str, exit_code: int = 0) -> None:
        """End an execution (synthetic ones end only this way, or stopped) as if its process
        exited with `exit_code`."""
        with self._lock:
            e = self._find(name)
            if self._ended(e):
                return
            proc = e.proc
        if proc is not None:
            killpg(proc, signal.SIGKILL)
        with self._lock:
            if self._ended(e):
                return
            if e.start_time is None:
                e.start_time, e.started_mono = time.time(), time.monotonic()
            e.exit_code = exit_code
            self._exited(e, exit_code)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.faults = 0

    def _respond(self, r: Request) -> Answer:
        raise NotImplementedError

    def _find(self, name: str) -> Any:
        """Under the lock: the execution called `name` (KeyError if there is none)."""
        raise NotImplementedError

    def _ended(self, e: Any) -> bool:
        """Under the lock: whether the execution has ended for good."""
        raise NotImplementedError

    def _exited(self, e: Any, exit_code: int) -> None:
        """Under the lock: the execution's process exited with `exit_code`: it ends as the cloud says."""
        raise NotImplementedError

    def _step(self, e: Any) -> None:
        """Under no lock: move one active execution on (start it, watch its process, end it)."""
        raise NotImplementedError

    def _started(self, name: str, proc: subprocess.Popen[bytes], job_name: str) -> None:
        """Under the lock: an execution's process started (counted in `runs` under `job_name`)."""
        self.processes[name] = proc
        self.runs[job_name] = self.runs.get(job_name, 0) + 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                active = [self._executions[n] for n in self._active if n in self._executions]
            for e in active:
                try:
                    self._step(e)
                except Exception as exc:  # noqa: BLE001 - keep playing the cloud for the others
                    print(f"{self.label}: {e.name}: {exc!r}", file=sys.stderr)
            self._stop.wait(0.01)


def page_token(cursor: Any) -> str:
    """An opaque page token that carries `cursor` (any JSON value), as the clouds' lists answer."""
    return base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode().rstrip("=")


def read_page_token(token: str) -> Any:
    """The cursor a `page_token` carries; ValueError for any other text."""
    try:
        return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except Exception as e:  # noqa: BLE001 - any garbage is a bad token
        raise ValueError(f"not a page token: {token!r}") from e


# ---- HTTPS ----------------------------------------------------------------------------------------

def self_signed_tls(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A throwaway certificate authority and a server certificate it signs for IP 127.0.0.1 and DNS
    localhost, written into `directory`. Returns the server's SSL context and the path of the CA's PEM
    (what clients pass as their CA bundle, e.g. azure-core's `connection_verify`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake cloud test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, ca_file


# ---- local processes that play cloud jobs ----------------------------------------------------------

def start_process(cmd: list[str], env: dict[str, str], hidden: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """Start a job's container command here: `python` is this interpreter (also for the tool the
    runner starts: its directory leads PATH, as the image's python has the package installed), the
    working directory the repository root and PYTHONPATH that root before this process's own,
    `env` goes over os.environ less the variables whose names start with one of `hidden` (a job
    without this host's credentials), stdout and stderr are merged into one pipe, and the process
    leads its own process group (so that killpg reaches its children)."""
    cmd = list(cmd)
    if cmd and cmd[0] == "python":
        cmd[0] = sys.executable
    path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    inherited = {k: v for k, v in os.environ.items() if not (hidden and k.startswith(hidden))}
    return subprocess.Popen(cmd, env={**inherited, "PYTHONPATH": pythonpath, "PATH": path, **env}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def forward_lines(proc: subprocess.Popen[bytes], write: Callable[[str], Any], done: threading.Event, *,
                  name: str) -> threading.Thread:
    """A daemon thread that passes each output line of `proc` (decoded, without its line end) to
    `write`, and sets `done` when the pipe ends (or is closed under it)."""
    def run() -> None:
        assert proc.stdout is not None
        try:
            for raw in iter(proc.stdout.readline, b""):
                write(raw.decode(errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass  # the pipe was closed by close()
        finally:
            done.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group `proc` leads (start_process makes it lead one); gone is fine.
    SIGKILL plays a container's end: every process below `proc` dies too, also those in sessions
    of their own (the runner starts the tool in one), as nothing outlives a container."""
    below = []
    if sig == signal.SIGKILL:
        try:
            below = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            pass
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in below:
        try:
            p.kill()
        except psutil.Error:
            pass


def play(e: Any, *, stopping: bool, grace_s: float, now: float) -> int | None:
    """One step of a cloud playing a container's process: a stop sends SIGTERM, then SIGKILL after
    `grace_s`; running past `e.timeout_s` is SIGKILLed (`e.timed_out`); once the process has exited
    everything left in the container dies with it. Returns the exit code (128 + signal for a
    signal) once the process has ended and its output has been forwarded (or 2 s have passed),
    else None. `e` holds proc, sigterm_mono, started_mono, timeout_s, timed_out, exited_mono and
    output_done (both fakes' executions do)."""
    proc = e.proc
    if proc.poll() is None:
        if stopping and e.sigterm_mono is None:
            e.sigterm_mono = now
            killpg(proc, signal.SIGTERM)
        elif e.sigterm_mono is not None and now - e.sigterm_mono > grace_s:
            killpg(proc, signal.SIGKILL)
        if not e.timed_out and e.started_mono is not None and now - e.started_mono > e.timeout_s:
            e.timed_out = True
            killpg(proc, signal.SIGKILL)
        return None
    if e.exited_mono is None:
        e.exited_mono = now
        killpg(proc, signal.SIGKILL)  # the container ends with its main process
    if not e.output_done.is_set() and now - e.exited_mono < 2.0:
        return None  # let the last lines reach the log first
    rc = proc.returncode
    return rc if rc >= 0 else 128 - rc


def reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group, wait for the process and close its pipe (the fakes' close())."""
    killpg(proc, signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc.stdout is not None:
        proc.stdout.close()
