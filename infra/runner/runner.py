"""The runner's main program: fetch inputs, run the tool as a process group, relay its output and
progress, stop it on request, collect its result and artifacts, and report the outcome. The
steps around the tool's process have files of their own: `inputs`, `relay`, `outputs`.

The outcome is written to the object store as `result.json` (the durable record) and sent as
the last event through the callback (the fast path). Every event, and the outcome document, is
made by the builders of `controlplane_runner.events`, where the format is written down. The runner
exits with the tool's exit code (128 + signal number when the tool was killed by a signal).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import ObjectExists, ObjectStore, open_store, result_key
from controlplane.objectstore.claim import take_claim
from controlplane_runner import events, materialize, proc, reporter
from controlplane_runner.claim import CLAIM_LOST, CLAIM_REFUSED, CLAIM_UNAVAILABLE
from controlplane_runner.granted import GrantedStore
from controlplane_runner.inputs import fetch_inputs, materialize_files
from controlplane_runner.outputs import read_result, upload_artifacts
from controlplane_runner.relay import relay_lines, relay_progress
from controlplane_runner.reporter import Reporter


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controlplane_runner", description=__doc__)
    p.add_argument("--job-name", default=os.environ.get("CONTROLPLANE_JOB_NAME", ""))
    p.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    p.add_argument("--exit-file", default=os.environ.get("CONTROLPLANE_EXIT_FILE"),
                   help="write the outcome here too (the local provider reads it)")
    p.add_argument("--tool-pid-file", default=None,
                   help="write the tool's process group and start time here (the local provider kills "
                        "what is left of it if this runner dies first)")
    p.add_argument("--claim-file", default=None,
                   help="start only if this runner is the first to claim the job here (controlplane_runner.claim; "
                        "`python -m controlplane_runner` claims before anything else)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- tool command and arguments")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no tool command given (put it after --)")
    return args


class Runner:
    def __init__(self, args: argparse.Namespace, env: dict[str, str]):
        self.args = args
        self.ref = AttemptRef.from_env(env)
        self.grace_s = float(env.get("CONTROLPLANE_KILL_GRACE_S", "10"))
        self.claim_wait_s = float(env.get("CONTROLPLANE_CLAIM_WAIT_S", "60"))
        store_url = env.get("CONTROLPLANE_STORE_URL")
        self.store_url = store_url
        self.file_inputs = env.get(materialize.INPUT_FILES_ENV) == "1"  # the launch says the task has some
        self.store: ObjectStore | None = None
        self.stop_requested = threading.Event()
        self.signalled = False  # a stop signal arrived (`stop_signalled`)
        self.stop_reason: str | None = None
        self.artifact_decls: dict[str, dict[str, Any]] = {}
        self.reporter = Reporter(
            ref=self.ref,
            store=self.store,
            callback_url=env.get("CONTROLPLANE_CALLBACK_URL") or None,
            bootstrap=env.get("CONTROLPLANE_BOOTSTRAP_TOKEN"),
            endpoint_file=env.get("CONTROLPLANE_ENDPOINT_FILE") or None,
            heartbeat_s=float(env.get("CONTROLPLANE_HEARTBEAT_S", "10")),
            on_stop=self.request_stop,
        )
        if store_url and env.get("CONTROLPLANE_STORE_ACCESS") == "grants":
            self.store = GrantedStore(store_url, self.ref, self.reporter.grants)
        elif store_url:
            self.store = open_store(store_url)
        self.reporter.store = self.store
        self.base_env = {k: v for k, v in env.items() if k != "CONTROLPLANE_BOOTSTRAP_TOKEN"}

    def request_stop(self, reason: str) -> None:
        """From another thread (the reporter, told to stop by the control plane)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_requested.set()

    def stop_signalled(self, *_: object) -> None:
        """The signal handler (SIGTERM, SIGINT). It takes no lock: it runs in the main thread
        between two bytecodes, maybe inside `stop_requested.wait` holding that Event's lock, or
        inside this handler for the signal before (cancels repeated quickly), and `Event.set`
        there would wait for ever on a lock its own thread holds. `_wait` sees the flag within
        its 50 ms tick."""
        if self.stop_reason is None:
            self.stop_reason = events.STOP_SIGNAL
        self.signalled = True

    @property
    def stopping(self) -> bool:
        return self.signalled or self.stop_requested.is_set()

    # ---- main -----------------------------------------------------------------------------
    def run(self) -> int:
        refused = self._claim()
        if refused is not None:  # another execution runs this attempt, or none may: read, run, write nothing
            return refused
        proc.become_subreaper()
        if self.args.workdir:  # the caller's directory (the local provider's job dir): it keeps it
            workdir = Path(self.args.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
            return self._run_in(workdir)
        # A scratch directory of its own goes when the run ends: a cloud job's container is thrown
        # away anyway, but a runner started on a host (a test, a VM) would leave one per task.
        with tempfile.TemporaryDirectory(prefix="cp-job-") as scratch:
            return self._run_in(Path(scratch))

    def _claim(self) -> int | None:
        """Claim the attempt (`controlplane.objectstore.claim`) before anything else: None when
        this execution holds it, else the exit status to end with, the tool never started. The
        control plane is asked first; only when it does not answer within CONTROLPLANE_CLAIM_WAIT_S
        does the runner take the claim in the object store itself. A runner with neither (run by
        hand) has nobody to share the attempt with and runs."""
        what = f"{self.args.job_name or 'job'} ({self.ref.task_id} attempt {self.ref.number})"
        if self.reporter.callback_url:
            verdict = self.reporter.claim(self.claim_wait_s)
            if verdict == reporter.OURS:
                return None
            if verdict == reporter.TAKEN:
                return _not_started(f"{what} is already claimed by another execution", CLAIM_LOST)
            if verdict == reporter.OVER:
                return _not_started(f"{what} is no longer the task's current attempt", CLAIM_REFUSED)
            if verdict == reporter.REFUSED:
                return _not_started(f"the control plane refused {what}'s bootstrap token", CLAIM_REFUSED)
        if self.store is None or isinstance(self.store, GrantedStore):
            if not self.reporter.callback_url:
                return None
            return _not_started(f"the control plane did not answer {what}'s claim for {self.claim_wait_s:g}s "
                                "and this job has no storage access of its own", CLAIM_UNAVAILABLE)
        mine = self.reporter.nonce_sha256
        try:
            holder = take_claim(self.store, self.ref, mine, by="runner")
        except OSError as e:
            return _not_started(f"{what} could not be claimed in the object store ({type(e).__name__})",
                                CLAIM_UNAVAILABLE)
        if holder != mine:
            return _not_started(f"{what} is already claimed by another execution", CLAIM_LOST)
        if self.reporter.callback_url:
            print(f"# claimed {what} in the object store: the control plane did not answer", flush=True)
        return None

    def _run_in(self, workdir: Path) -> int:
        artifacts_dir = workdir / "artifacts"
        artifacts_dir.mkdir(exist_ok=True)
        inputs_file = workdir / "inputs.json"
        result_file = workdir / "result.json"
        result_file.unlink(missing_ok=True)

        if isinstance(self.store, GrantedStore):
            self.store.prefetch()  # what the fallback path writes, while the control plane answers
        self.reporter.start()
        started = time.time()
        try:
            inputs = fetch_inputs(self.store, self.ref)
            materialize_files(self.store, self.store_url, self.ref, inputs, workdir, has_files=self.file_inputs)
        except Exception as e:  # noqa: BLE001 - reported as the job's failure, never swallowed
            why = f"{events.INPUTS_UNREADABLE}: {type(e).__name__}: {e}"  # the task's log only
            print(why, file=sys.stderr, flush=True)
            self.reporter.emit(events.log(why, stream=events.STDERR, level=events.ERROR))
            return self._finish(started, exit_code=None, signal_name=None, error=events.INPUTS_UNREADABLE,
                                result=None, artifacts=[])
        inputs_file.write_text(json.dumps(inputs))
        if self.stopping:  # stopped before the tool started: do not start it
            return self._finish(started, exit_code=None, signal_name=None, error="stopped before the tool started",
                                result=None, artifacts=[])

        read_fd, write_fd = os.pipe()
        env = dict(self.base_env)
        env.update(
            CONTROLPLANE_INPUTS_FILE=str(inputs_file),
            CONTROLPLANE_RESULT_FILE=str(result_file),
            CONTROLPLANE_ARTIFACTS_DIR=str(artifacts_dir),
            CONTROLPLANE_PROGRESS_FD=str(write_fd),
            PYTHONUNBUFFERED="1",
        )
        try:
            child = subprocess.Popen(
                self.args.command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                start_new_session=True,
            )
        except OSError as e:
            os.close(read_fd)
            os.close(write_fd)
            return self._finish(started, exit_code=127, signal_name=None,
                                error=f"cannot start tool: {e.strerror}", result=None, artifacts=[])
        os.close(write_fd)
        pgid = child.pid
        if self.args.tool_pid_file:
            Path(self.args.tool_pid_file).write_text(json.dumps({"pgid": pgid, "started_at": time.time()}))
        self.reporter.emit(events.started(pid=child.pid, job_name=self.args.job_name))

        emit = self.reporter.emit
        readers = [
            threading.Thread(target=relay_lines, args=(child.stdout, events.STDOUT, sys.stdout, emit), daemon=True),
            threading.Thread(target=relay_lines, args=(child.stderr, events.STDERR, sys.stderr, emit), daemon=True),
            threading.Thread(target=relay_progress, args=(read_fd, emit, self.artifact_decls), daemon=True),
        ]
        for t in readers:
            t.start()

        returncode = self._wait(child, pgid)
        # The leader is gone; whatever it left behind in its group (or that escaped it) goes too.
        proc.kill_tree(pgid, grace_s=0.5 if not self.stopping else 0.1)
        for t in readers:
            t.join(timeout=5)

        signal_name = None
        exit_code = returncode
        if returncode < 0:
            signal_name = signal.Signals(-returncode).name
            exit_code = 128 - returncode
        result, error = read_result(result_file)
        artifacts = upload_artifacts(self.store, self.ref, artifacts_dir, self.artifact_decls, self.reporter.emit)
        return self._finish(started, exit_code=exit_code, signal_name=signal_name, error=error,
                            result=result, artifacts=artifacts)

    def _wait(self, child: subprocess.Popen[bytes], pgid: int) -> int:
        term_at: float | None = None
        killed = False
        while True:
            rc = child.poll()
            if rc is not None:
                return rc
            if self.stopping:
                now = time.monotonic()
                if term_at is None:
                    term_at = now
                    proc.signal_group(pgid, signal.SIGTERM)
                elif not killed and now - term_at >= self.grace_s:
                    killed = True
                    proc.signal_group(pgid, signal.SIGKILL)
            if self.stopping:
                time.sleep(0.05)
            else:
                self.stop_requested.wait(0.05)

    def _finish(self, started: float, *, exit_code: int | None, signal_name: str | None,
                error: str | None, result: dict[str, Any] | None, artifacts: list[dict[str, Any]]) -> int:
        if self.stopping:
            status = events.CANCELLED
        elif exit_code == 0 and error is None:
            status = events.SUCCEEDED
        else:
            status = events.FAILED
        outcome = events.outcome(status=status, exit_code=exit_code, signal=signal_name, error=error,
                                 stop_reason=self.stop_reason, result=result, artifacts=artifacts,
                                 started_at=started, finished_at=time.time())
        if self.store is not None:
            try:
                self.store.put_bytes(result_key(self.ref),
                                     json.dumps(outcome).encode(), content_type="application/json")
            except ObjectExists:
                pass
            except Exception as e:  # noqa: BLE001 - the callback still carries the outcome
                print(f"runner: could not write result.json: {e}", file=sys.stderr)
        self.reporter.emit(events.finished(**outcome))
        self.reporter.close(timeout=45)
        if self.args.exit_file:
            tmp = self.args.exit_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(outcome, f)
            os.replace(tmp, self.args.exit_file)
        if exit_code is None:
            return 1
        return exit_code if status != events.CANCELLED else (exit_code or 143)


def _not_started(why: str, status: int) -> int:
    """Say on the job's console why this execution ends without running the tool."""
    print(f"# not started: {why}; the tool was not run (exit {status})", flush=True)
    return status


def main(argv: list[str] | None = None, early_signals: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runner = Runner(args, dict(os.environ))
    signal.signal(signal.SIGTERM, runner.stop_signalled)
    signal.signal(signal.SIGINT, runner.stop_signalled)
    if early_signals:  # stopped while starting up
        runner.stop_signalled()
    return runner.run()
