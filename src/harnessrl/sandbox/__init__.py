"""Sandbox: per-episode `Workspace` directories and untrusted command execution under isolation
and limits, behind one `Sandbox` interface with bwrap, unshare and none backends.

How it isolates, how a command runs and what each backend does not contain: docs/sandbox.md
and docs/security.md. Modules: `api` (types and errors), `workspace`, `base` (the interface and
its confined file operations), `isolation` (mount plan, bwrap argv, unshare setup script),
`server` (the stdlib-only command server that runs inside, shipped as source), `link` (the host
side of its control link), `session` (what both real backends share) and `backends`
(the backends, probing, `open_sandbox`).
"""

from harnessrl.sandbox.api import (
    BACKENDS,
    MAX_COMMAND_BYTES,
    MAX_MOUNTS,
    SANDBOX_HOST_UID,
    WORKSPACE_MOUNT,
    ExecResult,
    SandboxError,
    SandboxLimits,
    SandboxMount,
    SandboxUnavailableError,
    check_backend_name,
)
from harnessrl.sandbox.backends import available_backends, open_sandbox
from harnessrl.sandbox.base import Sandbox
from harnessrl.sandbox.isolation import (
    NO_PYCACHE,
    VERIFICATION_ENV,
    others_can_search,
    sandbox_env,
)
from harnessrl.sandbox.workspace import Workspace

__all__ = [
    "BACKENDS",
    "MAX_COMMAND_BYTES",
    "MAX_MOUNTS",
    "NO_PYCACHE",
    "SANDBOX_HOST_UID",
    "VERIFICATION_ENV",
    "WORKSPACE_MOUNT",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxMount",
    "SandboxUnavailableError",
    "Workspace",
    "available_backends",
    "check_backend_name",
    "open_sandbox",
    "others_can_search",
    "sandbox_env",
]
