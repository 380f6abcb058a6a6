"""An in-memory keyring backend for the desktop tests.

``PYTHON_KEYRING_BACKEND=tests.desktop.memory_keyring.MemoryKeyring``.
Lives as long as its process: a key saved through the desktop and used by a run of the same window."""

from __future__ import annotations

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self._values: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._values.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self._values[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self._values.pop((service, username), None) is None:
            raise PasswordDeleteError(username)
