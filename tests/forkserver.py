"""A fork server for the cloud fakes' job processes: `python -m MODULE ...` started by forking one
interpreter that has imported MODULE's dependencies already, instead of a new interpreter paying
Python's start and the imports (half a CPU second for a runner with a cloud store's SDK) for each
execution. What runs is the same program in a process of its own: `runpy` runs MODULE as
`__main__` with the job's argv, environment, working directory, session (so `killpg` reaches it
and what it starts) and merged stdout and stderr; signals, exit codes and pids are real.

    with ForkServer(preload=["controlplane_runner.runner", "controlplane.objectstore.gcs"]) as fs:
        fake.spawn = fs.start           # the fake's executions start through it

The server is a child of this process started once (a plain `start_process`), single-threaded so
that forking it is safe; each request carries the job's stdout pipe (SCM_RIGHTS) and is answered
with the pid, and each exit with its status. A command that is not `python -m` is started as usual.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import IO, Any, Self

from tests.fakehttp import ROOT, start_process

# The server's own program (run as `python -c`): preload, then fork a child per request.
SERVER = r"""
import importlib, json, os, runpy, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGCHLD, lambda *_: None)
import selectors
sel = selectors.DefaultSelector()
sel.register(sock, selectors.EVENT_READ, "req")
sel.register(r, selectors.EVENT_READ, "chld")

def child(req, fd):
    sock.close(); os.close(r); os.close(w)
    signal.set_wakeup_fd(-1)
    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0); os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd); os.close(null)
    os.chdir(req["cwd"])
    os.environ.clear(); os.environ.update(req["env"])
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback; traceback.print_exc(); code = 1
    try:
        sys.stdout.flush(); sys.stderr.flush()
    finally:
        os._exit(code)

while True:
    for key, _ in sel.select():
        if key.data == "req":
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 1)
            if not msg:
                sys.exit(0)
            req = json.loads(msg)
            pid = os.fork()
            if pid == 0:
                child(req, fds[0])
            os.close(fds[0])
            sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())
        else:
            try:
                os.read(r, 4096)
            except BlockingIOError:
                pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
"""


class Forked:
    """What the fakes use of a `subprocess.Popen` for a process the server forked: pid, stdout,
    returncode (negative for a signal), poll and wait."""

    def __init__(self, pid: int, stdout: IO[bytes], args: list[str]):
        self.pid, self.stdout, self.args = pid, stdout, args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class ForkServer:
    """Starts `python -m` commands by forking a preloaded interpreter (see the module docstring).
    `started` counts the processes it forked. A context manager: its exit stops the server (the
    processes it forked are the fakes' to kill)."""

    def __init__(self, preload: list[str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._server = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()), json.dumps(preload)],
                                        pass_fds=(theirs.fileno(),), cwd=ROOT, stdin=subprocess.DEVNULL,
                                        env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
        theirs.close()
        self._lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[int, tuple[threading.Event, list[int]]] = {}
        self._procs: dict[int, Forked] = {}
        self._early: dict[int, int] = {}  # exits read before the pid's answer was
        self.started = 0
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_WR)
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()
        self._sock.close()

    def start(self, cmd: list[str], env: dict[str, str], hidden: tuple[str, ...] = ()) -> Any:
        """`start_process`'s contract, forked when `cmd` is `python -m MODULE ...`."""
        if len(cmd) < 3 or cmd[0] not in ("python", sys.executable) or cmd[1] != "-m":
            return start_process(cmd, env, hidden)
        path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        inherited = {k: v for k, v in os.environ.items() if not (hidden and k.startswith(hidden))}
        full_env = {**inherited, "PYTHONPATH": pythonpath, "PATH": path, **env}
        r, w = os.pipe()
        done, answer = threading.Event(), []
        with self._lock:
            self._seq += 1
            rid = self._seq
            self._waiting[rid] = (done, answer)
            req = {"id": rid, "module": cmd[2], "args": cmd[3:], "env": full_env, "cwd": str(ROOT)}
            socket.send_fds(self._sock, [json.dumps(req).encode()], [w])
        os.close(w)
        if not done.wait(30):
            os.close(r)
            raise OSError("the fork server did not answer")
        proc = Forked(answer[0], os.fdopen(r, "rb"), cmd)
        with self._lock:
            self._procs[proc.pid] = proc
            self.started += 1
            if proc.pid in self._early:
                proc._exit(self._early.pop(proc.pid))
        return proc

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            msg = json.loads(data)
            with self._lock:
                if "id" in msg:
                    done, answer = self._waiting.pop(msg["id"])
                    answer.append(msg["pid"])
                    done.set()
                elif (proc := self._procs.pop(msg["exited"], None)) is not None:
                    proc._exit(msg["code"])
                else:
                    self._early[msg["exited"]] = msg["code"]
