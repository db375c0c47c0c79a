"""Who may ask: the API key (from an environment variable, compared in constant time)
and the rule for binds: an address other than loopback needs a key, or the operator's
explicit --insecure-no-key."""

from __future__ import annotations

import hmac
import ipaddress
import os

from engine.errors import InputError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


class ApiKey:
    """The key requests must bring as `Authorization: Bearer KEY`; None: no key needed."""

    def __init__(self, key: str | None) -> None:
        self._key = key.encode("utf-8") if key else None

    @classmethod
    def from_env(cls, name: str | None) -> ApiKey:
        """The key in the environment variable `name` (no name: no key). A named variable
        that is unset or empty is an error: a server the operator meant to protect must
        not start open."""
        if not name:
            return cls(None)
        value = os.environ.get(name, "")
        if not value.strip():
            raise InputError(f"--api-key-env {name}: the variable is not set or empty")
        return cls(value.strip())

    @property
    def required(self) -> bool:
        return self._key is not None

    def allows(self, authorization: str | None) -> bool:
        """Whether the Authorization header carries the key (always, without a key)."""
        if self._key is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode("utf-8"), self._key)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or name (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, key: ApiKey, insecure_no_key: bool) -> None:
    """Refuse to listen beyond this machine without a key unless told to."""
    if is_loopback(host) or key.required or insecure_no_key:
        return
    raise InputError(
        f"refusing to listen on {host} without an API key: anyone who can reach it could use the model. "
        "Set one with --api-key-env NAME, or pass --insecure-no-key if the network is yours alone"
    )
