"""Local code-execution sandbox: a persistent Python REPL in a bubblewrap-isolated worker.

``LocalSandbox`` (async, :mod:`fleet_rlm.sandbox.local`) is the core; ``SandboxInterpreter``
(:mod:`fleet_rlm.sandbox.interpreter`) adapts it to dspy's ``CodeInterpreter`` protocol and is
imported from its module so that using the sandbox does not import dspy.
"""

from fleet_rlm.sandbox.local import ExecResult, HostFunction, LocalSandbox, SandboxError, detect_isolation

__all__ = ["ExecResult", "HostFunction", "LocalSandbox", "SandboxError", "detect_isolation"]
