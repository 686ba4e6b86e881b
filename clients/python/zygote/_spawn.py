"""Sending one ``Spawn`` request: what :class:`zygote.Popen` and
``create_subprocess_exec`` share, and the module's default client.

The default client is made by a factory that :mod:`zygote._client`
registers, so that the modules that start children need not import the
client's (which imports them).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Protocol

from . import _request, _sandbox
from ._conn import Connection, SpawnSlot
from ._errors import ZygoteError


class Endpoint(Protocol):
    """What a request needs of a client: its connection for a new request
    (reconnected after a loss or in a forked child), whether it is up, and
    the process settings its requests copy."""

    @property
    def alive(self) -> bool: ...

    def _connection(self) -> Connection: ...

    def _process_state(self) -> _request.ProcessState: ...


_default: Optional[Endpoint] = None
_default_factory: Optional[Callable[[], Endpoint]] = None
_default_lock = threading.Lock()


def set_default_factory(factory: Callable[[], Endpoint]) -> None:
    """How the default client is made (``Client()``)."""
    global _default_factory
    _default_factory = factory


def default() -> Any:
    """The module's client, connected on first use and again after its
    connection was lost or this process forked."""
    global _default
    client = _default
    if client is not None and client.alive:
        return client
    with _default_lock:
        if _default is None or not _default.alive:
            assert _default_factory is not None, "zygote._client registers the factory"
            _default = _default_factory()
        return _default


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held it at the fork.
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Outgoing:
    """One ``Spawn`` request on one connection: built and encoded
    (raising, before anything is sent, for any value out of range), then
    registered and sent, or given up."""

    def __init__(
        self,
        conn: Connection,
        spec: _request.ChildSpec,
        slot: SpawnSlot,
        state: _request.ProcessState,
    ) -> None:
        self.conn = conn
        self.slot = slot
        self.request_id = conn.next_id()
        message, self.fds = _request.build_spawn(spec, self.request_id, conn.max_fds, state)
        _sandbox.check_offered(spec.options.sandbox, conn.features, conn.protocol_version)
        if spec.template is not None:
            _request.check_templates_offered(conn.features, conn.protocol_version)
        # Through the module, so that tests can watch the encoded requests.
        self.frame = _request.encode_spawn(message, conn.max_frame, conn.protocol_version)

    def register(self) -> None:
        self.conn.register_spawn(self.request_id, self.slot)

    def abandon(self, sent: bool) -> None:
        """Forgets the request; if it may have been sent, its child is
        killed as soon as it is reported."""
        self.conn.unregister(self.request_id, sent)


def send(endpoint: Endpoint, spec: _request.ChildSpec) -> Outgoing:
    """Builds, registers and sends a request on ``endpoint``'s connection.
    A request that never left because the connection was found gone at
    that instant goes once more, on a new connection."""
    state = endpoint._process_state()
    for attempt in range(2):
        request = Outgoing(endpoint._connection(), spec, SpawnSlot(), state)
        receipt: List[bool] = []
        try:
            request.register()
            request.conn.send(request.frame, request.fds, receipt)
        except ZygoteError as error:
            request.abandon(sent=False)
            if attempt == 0 and request.conn.ended_by_send(error):
                continue
            raise
        except BaseException:
            # An interrupt before or after the frame left (never between):
            # if it left, the child reported for this id is killed.
            request.abandon(sent=bool(receipt))
            raise
        return request
    raise AssertionError("unreachable: the second attempt returns or raises")
