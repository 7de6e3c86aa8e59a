"""The in-job runner: one entrypoint that wraps a tool command inside any job.

    python -m controlplane_runner [--job-name NAME] [--workdir DIR] [--exit-file PATH] -- TOOL COMMAND...

It is the same program in a local process tree and in a cloud container, and it needs only the
standard library (plus the SDK of a cloud object store when one is used).

Environment the control plane gives the runner:

    CONTROLPLANE_TASK_ID, CONTROLPLANE_ATTEMPT   which task attempt this job is
    CONTROLPLANE_STORE_URL                       object store holding inputs, results, artifacts
    CONTROLPLANE_CALLBACK_URL                    base URL of the runner API (optional)
    CONTROLPLANE_BOOTSTRAP_TOKEN                 one-time token, traded on start for the attempt's
                                                 callback secret (POST .../claim with a nonce), so
                                                 a copy read later from the job's spec is dead
    CONTROLPLANE_ENDPOINT_FILE                   (local) file naming the current callback URL
    CONTROLPLANE_STORE_ACCESS                    `grants`: no cloud credentials; read and write
                                                 through URLs signed by the control plane
                                                 (`controlplane_runner.granted`)
    CONTROLPLANE_HEARTBEAT_S, CONTROLPLANE_KILL_GRACE_S
    CONTROLPLANE_CLAIM_WAIT_S                    seconds to wait for the control plane to answer the
                                                 claim before claiming in the object store (60)

Environment the runner gives the tool (the job contract a tool is written against):

    CONTROLPLANE_INPUTS_FILE     JSON object of the task's inputs
    CONTROLPLANE_RESULT_FILE     where the tool writes its result (a JSON object)
    CONTROLPLANE_ARTIFACTS_DIR   files left here become the task's artifacts
    CONTROLPLANE_PROGRESS_FD     file descriptor taking JSON lines:
                                 {"percent", "step", "step_total", "phase", "message", "eta_s"}
                                 or {"type": "artifact", "name", "kind", "content_type"}
    CONTROLPLANE_TASK_ID, CONTROLPLANE_ATTEMPT

Python tools can use `controlplane_runner.toolkit` instead of the raw variables. stdout and stderr
become the task's log lines. The tool runs in its own process group; SIGTERM to the runner is
forwarded to that group and escalated to SIGKILL after the grace period.

What the runner reports to the control plane (its events and `result.json`) is written down in
`controlplane_runner.events`, which both sides import.
"""
