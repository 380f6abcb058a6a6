"""One error hierarchy for everything a face reports to a person.

Core raises these; each face maps them in one place (CLI: exit code, MCP: tool error, HTTP:
status). The message is written for the person: what went wrong and how to fix it. Anything
that is not a ``FleetError`` is a bug or an outage and is reported as an internal failure.
Imports nothing of the package, so every face can use it for free.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error with a message meant for the user."""

    exit_code = 1  # CLI exit status
    http_status = 500

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


class UserError(FleetError, ValueError):
    """The request itself is wrong (bad argument, bad setting): fix it and retry."""

    exit_code = 2
    http_status = 400


class NotFound(UserError, KeyError):
    """Something named in the request does not exist (a run, a volume, a file)."""

    http_status = 404

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class RunNotFound(NotFound):
    """No run matches the id (or ``last``, or part of an id) given. The message names no face's
    command: each face adds where its user lists runs (CLI `fleet-rlm runs`, MCP list_runs)."""


class Conflict(UserError):
    """The request clashes with the current state (a closed session, a run already finished)."""

    http_status = 409


class Unavailable(FleetError):
    """Something needed is not reachable or not installed (the model, the sandbox, the keyring)."""

    exit_code = 1
    http_status = 503


class StoreError(Unavailable):
    """The store cannot be opened or used (e.g. written by a newer fleet-rlm)."""


class StoreLocked(StoreError):
    """Another process held the store's write lock for longer than a write waits for it: try again."""


class StoreFull(StoreError):
    """The disk that holds the store has no space left: nothing is recorded until space is freed."""


class TooLarge(UserError):
    """The request carries more data than allowed (an upload past ``upload_max_mb``)."""

    http_status = 413
