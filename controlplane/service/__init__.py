"""The task operations behind the canonical tools: submit, status, logs, list, cancel, result,
usage, one module each, with their answers typed in `answers` and the access rules for a caller
in `access`; `TaskService` composes them.

Transport-agnostic: the MCP surface, the dashboard and the CLI call these with a caller identity
and a validated request. Someone else's task the caller may not read answers exactly like an
unknown one (NOT_FOUND).
"""

from controlplane.service.facade import TaskService

__all__ = ["TaskService"]
