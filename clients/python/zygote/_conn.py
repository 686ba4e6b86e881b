"""One connection to a zygote: the socket, the handshake, and the
receiving of replies, each handed to whoever waits for its request id.

Sending needs no lock: a SOCK_SEQPACKET ``sendmsg`` sends one whole frame
atomically, so threads send concurrently and then wait for their reply.

Receiving is one role, held by one thread at a time. A thread that waits
for a reply while nobody receives takes the role itself: it reads and
dispatches every frame (its own and anyone else's) until its reply is in,
then gives the role up, so a lone caller hears its reply with no hand-over
between threads. A thread that finds the role taken waits for the holder
to dispatch its reply. The connection's reader thread sleeps until the
role is free and somebody needs frames read: a thread still waiting when
the holder leaves, a spawn whose reply goes to a callback (asyncio), a
spawn given up before its reply (its child is killed when reported), or
the end of the connection. ``Popen.poll`` reads what has come without
blocking (:meth:`Connection.collect`).

Python runs signal handlers in the main thread only, between two
bytecodes. When the main thread receives, it waits for a frame with the
signals open, so a handler that raises (KeyboardInterrupt) interrupts the
wait before a frame is taken; it then takes and dispatches the frame with
the asynchronous signals blocked, so that no handler can raise between the
two and lose the frame. The role passes on, and the others are served.
"""

from __future__ import annotations

import array
import contextlib
import errno
import importlib
import itertools
import os
import select
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from . import _wire
from ._errors import ZygoteError

#: A send failing with one of these found the zygote gone: nothing was sent.
_GONE_ON_SEND = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})
#: How long a connection ended by a failed send waits for its reader.
_READER_END_SECONDS = 1.0
#: How often the idle reader thread checks whether it is needed.
_READER_RECHECK_SECONDS = 1.0

#: Blocked while the main thread takes and dispatches a frame: every signal
#: but those a fault raises, which cannot wait.
_DEFERRED_SIGNALS = frozenset(int(number) for number in signal.valid_signals()) - {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
}
#: The C function under ``signal.pthread_sigmask``, which turns each number
#: of the mask it returns into an enum member: ~50 µs a call, three calls
#: per hold, where the C function takes ~2 µs.
_sigmask: Callable[[int, Iterable[int]], Set[int]] = importlib.import_module(
    "_signal"
).pthread_sigmask

#: The name this client gives in ``Hello``.
CLIENT_NAME = "zygote-py/0.1.0"
#: The protocol version Hello offers: the newest, lowered by tests to talk
#: to a real daemon as a client of an older version does.
HELLO_VERSION = _wire.PROTOCOL_VERSION
#: How long the handshake and a blocked send may take before the daemon
#: counts as stuck.
HANDSHAKE_SECONDS = 10.0
SEND_SECONDS = 30.0
SNDBUF_BYTES = 512 * 1024


@contextlib.contextmanager
def _handlers_deferred() -> Iterator[None]:
    """In the main thread, holds signal handlers back until the block is
    done: a handler pending at entry runs (and may raise) before it, one
    for a signal that comes during it runs at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Both calls run pending handlers after they set the mask: the first
    # changes nothing, and the second is inside the try that restores it.
    before = _sigmask(signal.SIG_BLOCK, ())
    try:
        _sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
        yield
    finally:
        _sigmask(signal.SIG_SETMASK, before)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _kill(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass


def _fds_of(ancdata: List[Any]) -> List[int]:
    fds: List[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            ints = array.array("i")
            ints.frombytes(data[: len(data) - len(data) % ints.itemsize])
            fds.extend(ints)
    return fds


class SpawnSlot:
    """What one spawn request waits for: ``Spawned`` (or ``SpawnFailed``),
    then ``Exited``. The receiving thread fills it; callbacks let asyncio
    hear about it without a thread blocking."""

    __slots__ = (
        "abandoned",
        "error",
        "exit",
        "exited",
        "fds",
        "on_exit",
        "on_spawn",
        "reply",
        "spawned",
    )

    def __init__(self) -> None:
        self.spawned = threading.Event()
        self.reply: Optional[Dict[str, Any]] = None
        self.fds: List[int] = []
        self.exited = threading.Event()
        self.exit: Optional[Dict[str, Any]] = None
        self.error: Optional[ZygoteError] = None
        self.on_spawn: Optional[Callable[[], None]] = None
        self.on_exit: Optional[Callable[[], None]] = None
        self.abandoned = False

    def _fire(self, callback: Optional[Callable[[], None]]) -> None:
        if callback is not None:
            try:
                callback()
            except Exception:  # the receiving thread must survive any waiter
                pass


class Connection:
    """A connected, handshaken socket plus its reader thread."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self.where = where
        self._sock = sock
        self._ids = itertools.count(1)
        self._slots: Dict[int, SpawnSlot] = {}
        self._signals: Dict[int, "threading.Event"] = {}
        self._signal_replies: Dict[int, Dict[str, Any]] = {}
        # Spawns whose caller gave up (interrupted, cancelled) before the
        # reply: their child is killed when Spawned comes.
        self._abandoned: Set[int] = set()
        # Guards the hand-over of a Spawned reply against a caller giving
        # up at the same moment, and the receiving role below; held only
        # for a few statements, never across a round trip. Reentrant: a
        # finalizer run by the garbage collector while this thread holds
        # it may give a spawn up (or poll).
        self._lock = threading.RLock()
        # The receiving role: whether a thread holds it, the events of the
        # threads waiting for its holder, and the spawns whose replies go to
        # callbacks, which the reader thread receives for.
        self._receiving = False
        self._followers: List[threading.Event] = []
        self._watched: Set[int] = set()
        self._reader_wake = threading.Condition(self._lock)
        # Set by close() and by a failed send: read on to the end.
        self._ending = False
        self._lost: Optional[ZygoteError] = None
        self._closing = False
        # Frames are read into this one buffer (the handshake, then only
        # the receiving thread): a fresh max-frame bytes object per reply
        # cost an mmap and an mremap each.
        self._recv_buffer = bytearray()
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)
        self.pid = os.getpid()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
        except OSError:
            pass  # capped by net.core.wmem_max; that is fine
        ack = self._handshake()
        self.limits: Dict[str, Any] = dict(ack["limits"])
        #: The protocol version the daemon answered in, and the optional
        #: features it offers (none in version 1).
        self.protocol_version = int(ack["protocol_version"])
        self.features: Tuple[str, ...] = tuple(ack.get("features", ()))
        self.max_frame = int(self.limits["max_frame_bytes"])
        self.max_fds = int(self.limits["max_fds_per_frame"])
        self._reader = threading.Thread(
            target=self._read_loop, name=f"zygote-reader {where}", daemon=True
        )
        self._reader.start()

    # --- the handshake, before the reader runs -------------------------

    def _handshake(self) -> Dict[str, Any]:
        offered = HELLO_VERSION
        hello = {"Hello": {"protocol_version": offered, "client": CLIENT_NAME}}
        self._sock.settimeout(HANDSHAKE_SECONDS)
        try:
            self._sock.sendmsg([_wire.encode_client(hello)], [], socket.MSG_NOSIGNAL)
            frame, fds = self._recv(_wire.MAX_FRAME_BYTES, _wire.MAX_FDS_PER_FRAME)
        except socket.timeout:
            raise ZygoteError(
                errno.ETIMEDOUT,
                f"zygote at {self.where} did not answer Hello within {HANDSHAKE_SECONDS:.0f} s",
            ) from None
        except OSError as error:
            raise ZygoteError(
                error.errno, f"handshake with zygote at {self.where} failed: {error.strerror}"
            ) from None
        finally:
            self._sock.settimeout(None)
        _close_all(fds)
        if frame is None:
            raise ZygoteError(
                errno.ECONNRESET, f"zygote at {self.where} closed the connection during Hello"
            )
        try:
            message = _wire.decode_server(frame)
        except _wire.DecodeError as error:
            raise ZygoteError(
                errno.EPROTO, f"zygote at {self.where} sent a bad HelloAck: {error}"
            ) from None
        if isinstance(message, dict) and "HelloAck" in message:
            ack: Dict[str, Any] = message["HelloAck"]
            # The daemon answers in the newest version both know: ours or
            # older, never one we did not offer.
            version = ack["protocol_version"]
            if not _wire.OLDEST_PROTOCOL_VERSION <= version <= offered:
                raise ZygoteError(
                    errno.EPROTO,
                    f"zygote at {self.where} answered in protocol version {version}; "
                    f"this client speaks versions {_wire.OLDEST_PROTOCOL_VERSION} "
                    f"to {offered}",
                )
            return ack
        if isinstance(message, dict) and "ProtocolError" in message:
            error_body = message["ProtocolError"]
            code = errno.EACCES if error_body["kind"] == "PermissionDenied" else errno.EPROTO
            if error_body["kind"] == "Busy":
                code = errno.EAGAIN
            raise ZygoteError(
                code,
                f"zygote at {self.where} refused the connection "
                f"({error_body['kind']}): {error_body['message']}",
            )
        raise ZygoteError(errno.EPROTO, f"zygote at {self.where} answered Hello with {message!r}")

    def _recv(
        self, max_frame: int, max_fds: int, flags: int = 0
    ) -> "tuple[Optional[bytes], List[int]]":
        """One frame and its fds; ``None`` at end of stream."""
        if len(self._recv_buffer) != max_frame + 1:
            self._recv_buffer = bytearray(max_frame + 1)
        while True:
            try:
                size, ancdata, flags, _ = self._sock.recvmsg_into(
                    [self._recv_buffer],
                    socket.CMSG_SPACE(max_fds * 4),
                    socket.MSG_CMSG_CLOEXEC | flags,
                )
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
        data = bytes(memoryview(self._recv_buffer)[:size])
        fds = _fds_of(ancdata)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            _close_all(fds)
            raise ZygoteError(
                errno.EMSGSIZE, f"zygote at {self.where} sent a frame over the limits"
            )
        if not data and not fds:
            return None, []
        return data, fds

    # --- receiving --------------------------------------------------------

    def wait(self, event: threading.Event, timeout: Optional[float] = None) -> bool:
        """Waits at most ``timeout`` seconds (None: no limit) for ``event``,
        set when the reply it stands for is dispatched or the connection
        ends; True once it is set. When no thread is receiving, this one
        receives until its reply is in."""
        if event.is_set():
            return True
        if os.getpid() != self.pid:
            self.forsake_after_fork()  # sets every event of the parent's
            return event.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        # Both flags are set with the state they stand for, inside the try:
        # a signal handler raising anywhere here still gives the role up.
        leading = following = False
        try:
            with self._lock:
                if not self._receiving and self._lost is None:
                    leading = self._receiving = True
                else:
                    following = True
                    self._followers.append(event)
            if following:
                return event.wait(timeout)
            while not event.is_set() and self._lost is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._receive_one(left)
            return event.is_set()
        finally:
            if leading:
                self._receiving = False  # first: no call in between
                self._step_down()
            elif following:
                with self._lock:
                    try:
                        self._followers.remove(event)
                    except ValueError:
                        pass  # interrupted before it was added

    def collect(self) -> None:
        """Dispatches the frames that have come (and the connection's end),
        without blocking, unless another thread is receiving them."""
        if os.getpid() != self.pid:
            return
        leading = False
        try:
            with self._lock:
                if self._receiving or self._lost is not None:
                    return
                leading = self._receiving = True
            while self._lost is None and self._receive_one(0.0):
                pass
        finally:
            if leading:
                self._receiving = False
                self._step_down()

    def _step_down(self) -> None:
        """Gives the receiving role up; wakes the reader thread if anybody
        still needs frames read (or the connection ended, so it exits)."""
        with self._lock:
            self._receiving = False
            if self._lost is not None or self._reader_wanted():
                self._reader_wake.notify()

    def _reader_wanted(self) -> bool:
        """Whether frames must be read for anyone but a receiving caller.
        The lock is held."""
        return (
            self._ending
            or bool(self._watched)
            or bool(self._abandoned)
            or any(not event.is_set() for event in self._followers)
        )

    def _receive_one(self, wait: Optional[float]) -> bool:
        """Reads and dispatches one frame, or ends the connection; False
        when no frame came within ``wait`` seconds (None: blocks). The
        caller holds the receiving role."""
        flags = 0
        main = threading.current_thread() is threading.main_thread()
        if wait is not None or main:
            timeout = -1 if wait is None else max(0, int(wait * 1000 + 0.999))
            if not self._poller.poll(timeout):
                return False
            flags = socket.MSG_DONTWAIT
        with _handlers_deferred():
            return self._take_one(flags)

    def _take_one(self, flags: int) -> bool:
        """Reads and dispatches the frame that has come (or ends the
        connection); False when none had."""
        try:
            frame, fds = self._recv(self.max_frame, self.max_fds, flags)
        except BlockingIOError:
            return False
        except ZygoteError as error:
            self._end(error)
            return True
        except OSError as error:
            if error.errno is None:
                raise  # not the socket's: a signal handler's, say
            self._end(
                ZygoteError(
                    error.errno,
                    f"reading from the zygote at {self.where} failed: {error.strerror}",
                )
            )
            return True
        if frame is None:
            self._end(
                ZygoteError(errno.ECONNRESET, f"the zygote at {self.where} closed the connection")
            )
            return True
        try:
            message = _wire.decode_server(frame, self.protocol_version)
        except _wire.DecodeError as error:
            _close_all(fds)
            self._end(
                ZygoteError(errno.EPROTO, f"the zygote at {self.where} sent a bad frame: {error}")
            )
            return True
        stop = self._dispatch(message, fds)
        if stop is not None:
            self._end(stop)
        return True

    def _end(self, reason: ZygoteError) -> None:
        if self._closing:
            reason = ZygoteError(errno.ESHUTDOWN, f"the client of {self.where} was closed")
        self._fail_all(reason)

    def _read_loop(self) -> None:
        """The reader thread: receives while the role is free and somebody
        needs frames read; exits once the connection has ended."""
        while True:
            with self._lock:
                while self._receiving or not self._reader_wanted():
                    if self._lost is not None:
                        return
                    # Woken by whoever makes it needed; the timeout only
                    # covers a wake lost to a signal handler raising.
                    self._reader_wake.wait(_READER_RECHECK_SECONDS)
                if self._lost is not None:
                    return
                self._receiving = True
            try:
                while self._lost is None:
                    self._receive_one(None)
                    with self._lock:
                        if not self._reader_wanted():
                            break
            except Exception as error:  # a bug here must not leave waiters hanging
                self._end(
                    ZygoteError(
                        errno.EPROTO, f"the client's reader for {self.where} failed: {error!r}"
                    )
                )
            finally:
                self._step_down()

    def _dispatch(self, message: Any, fds: List[int]) -> Optional[ZygoteError]:
        ((name, body),) = message.items()
        if name == "Spawned":
            with self._lock:
                slot = self._slots.get(body["id"])
                abandoned = slot is None and body["id"] in self._abandoned
                self._abandoned.discard(body["id"])
                if slot is not None:
                    slot.reply = message
                    slot.fds = fds
                    slot.spawned.set()
                if abandoned:
                    # Its Exited is read as soon as it comes, too.
                    self._watched.add(body["id"])
            if slot is None:
                if abandoned and fds:
                    _kill(fds[0])
                _close_all(fds)
                return None
            slot._fire(slot.on_spawn)
            return None
        _close_all(fds)
        if name == "SpawnFailed":
            with self._lock:
                self._abandoned.discard(body["id"])
                slot = self._forget(body["id"])
            if slot is not None:
                slot.reply = message
                slot.spawned.set()
                slot._fire(slot.on_spawn)
        elif name == "Exited":
            with self._lock:
                self._abandoned.discard(body["id"])
                slot = self._forget(body["id"])
            if slot is not None:
                slot.exit = body
                slot.exited.set()
                if not slot.spawned.is_set():
                    # A deferred spawn whose child ended before its
                    # Spawned was due: the Exited is its only reply.
                    slot.reply = message
                    slot.spawned.set()
                    slot._fire(slot.on_spawn)
                slot._fire(slot.on_exit)
        elif name in ("SignalSent", "RequestFailed", "Status", "TemplateReady", "Templates"):
            event = self._signals.pop(body["id"], None)
            if event is not None:
                self._signal_replies[body["id"]] = message
                event.set()
        elif name == "ProtocolError":
            return ZygoteError(
                errno.EPROTO,
                f"the zygote at {self.where} reported a protocol error "
                f"({body['kind']}): {body['message']}",
            )
        return None

    def _forget(self, request_id: int) -> Optional[SpawnSlot]:
        """Drops a spawn's slot. The lock is held."""
        self._watched.discard(request_id)
        return self._slots.pop(request_id, None)

    def _fail_all(self, reason: ZygoteError) -> None:
        self._lost = reason
        slots = list(self._slots.values())
        self._slots.clear()
        self._watched.clear()
        for slot in slots:
            slot.error = reason
            if not slot.spawned.is_set():
                slot.spawned.set()
                slot._fire(slot.on_spawn)
            slot.exited.set()
            slot._fire(slot.on_exit)
        for event in list(self._signals.values()):
            event.set()
        self._signals.clear()

    def forsake_after_fork(self) -> None:
        """In a forked child: this process's copy of the parent's
        connection is closed, never shut down (that would end the
        parent's), and every request the parent had in flight on it counts
        as lost here, so that nothing in this process waits for a reply
        the parent's reader gets. No callbacks run: the child has no
        reader thread, and its event loop may be a copy of the parent's."""
        if self.pid == os.getpid() or self._closing:
            return
        reason = ZygoteError(
            errno.ECHILD,
            f"the connection to the zygote at {self.where} belongs to the process "
            "that forked this one",
        )
        self._lost = reason
        for slot in list(self._slots.values()):
            slot.error = reason
            slot.spawned.set()
            slot.exited.set()
        self._slots.clear()
        self._watched.clear()
        for event in list(self._signals.values()):
            event.set()
        self._signals.clear()
        self._abandoned.clear()
        self._sock.close()

    # --- requests ---------------------------------------------------------

    @property
    def lost(self) -> Optional[ZygoteError]:
        """Why the connection ended, unless this client closed it."""
        self.collect()  # an end that nobody has read yet
        return None if self._closing else self._lost

    @property
    def alive(self) -> bool:
        self.collect()
        return self._lost is None and not self._closing

    def check(self) -> None:
        """Raises the reason the connection is gone, if it is."""
        if self._lost is not None:
            raise ZygoteError(self._lost.errno, self._lost.strerror)
        if self._closing:
            raise ZygoteError(errno.ESHUTDOWN, f"the client of {self.where} is closed")

    def next_id(self) -> int:
        return next(self._ids)

    def try_send(
        self, frame: bytes, fds: Sequence[int], receipt: Optional[List[bool]] = None
    ) -> bool:
        """Sends without blocking; False when the socket buffer is full.
        Once the frame has left, ``receipt`` holds True, even if a signal
        handler raises as this returns."""
        self.check()
        if os.getpid() != self.pid:
            # Never on the parent's connection from a forked child.
            self.forsake_after_fork()
            self.check()
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            with _handlers_deferred():
                self._sock.sendmsg([frame], ancillary, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
                if receipt is not None:
                    receipt.append(True)
        except BlockingIOError:
            return False
        except OSError as error:
            raise ZygoteError(
                error.errno,
                f"sending to the zygote at {self.where} failed: {error.strerror}",
            ) from None
        return True

    def send(self, frame: bytes, fds: Sequence[int], receipt: Optional[List[bool]] = None) -> None:
        """Sends, waiting at most ``SEND_SECONDS`` for buffer space;
        ``receipt`` as in :meth:`try_send`."""
        deadline = time.monotonic() + SEND_SECONDS
        while not self.try_send(frame, fds, receipt):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError(
                    errno.ETIMEDOUT,
                    f"the zygote at {self.where} has not read a request for {SEND_SECONDS:.0f} s",
                )
            poller = select.poll()
            poller.register(self._sock.fileno(), select.POLLOUT)
            poller.poll(left * 1000)

    def ended_by_send(self, error: ZygoteError) -> bool:
        """After a failed send: True when ``error`` says the zygote is gone
        (the request never left, so it may be sent again on a new
        connection). Ends this connection and waits for its reader, so that
        :attr:`lost` is set and the next request reconnects."""
        if error.errno not in _GONE_ON_SEND or os.getpid() != self.pid:
            return False
        if self._lost is None:
            self._end_reading()
            if self._reader is not threading.current_thread():
                self._reader.join(_READER_END_SECONDS)
        return self._lost is not None

    def _end_reading(self) -> None:
        """Shuts the socket down and has it read to its end (by the
        receiving thread, or else the reader thread), which fails every
        request still waiting."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            self._ending = True
            self._reader_wake.notify()

    def fileno(self) -> int:
        return self._sock.fileno()

    def register_spawn(self, request_id: int, slot: SpawnSlot) -> None:
        self.check()
        with self._lock:
            self._slots[request_id] = slot
            if slot.on_spawn is not None or slot.on_exit is not None:
                # Nobody may wait for this reply: the reader thread reads it.
                self._watched.add(request_id)
                if not self._receiving:
                    self._reader_wake.notify()
        if self._lost is not None:  # lost between the check and now
            with self._lock:
                self._forget(request_id)
            self.check()

    def unregister(self, request_id: int, sent: bool) -> None:
        """Forgets a spawn whose caller gave up; if the request was sent,
        its child is killed as soon as it is reported."""
        if os.getpid() != self.pid:
            return  # the parent's request, and the parent's child
        with self._lock:
            slot = self._forget(request_id)
            if slot is None:
                return
            slot.abandoned = True
            if sent and not slot.spawned.is_set():
                # The reader thread kills the child once it is reported.
                self._abandoned.add(request_id)
                if not self._receiving:
                    self._reader_wake.notify()
                return
        if sent and slot.reply is not None and "Spawned" in slot.reply:
            _kill(slot.fds[0])
            _close_all(slot.fds)

    def request(self, message: Dict[str, Any], timeout: float = SEND_SECONDS) -> Dict[str, Any]:
        """Sends a request other than a spawn (Signal, Status, Template,
        ListTemplates) and waits for its reply."""
        (body,) = message.values()
        request_id = body["id"]
        event = threading.Event()
        self.check()
        self._signals[request_id] = event
        self.send(_wire.encode_client(message), ())
        if not self.wait(event, timeout):
            self._signals.pop(request_id, None)
            raise ZygoteError(
                errno.ETIMEDOUT, f"the zygote at {self.where} did not answer within {timeout} s"
            )
        reply = self._signal_replies.pop(request_id, None)
        if reply is None:
            self.check()
            raise ZygoteError(errno.ECONNRESET, f"the zygote at {self.where} went away")
        return reply

    def close(self) -> None:
        """Closes the connection; children keep running (PROTOCOL.md 2.4)."""
        if self._closing:
            return
        self._closing = True
        if os.getpid() != self.pid:
            # A forked copy: the socket is shared with the parent, whose
            # connection must not be shut down from here.
            self._sock.close()
            return
        self._end_reading()
        if self._reader is not threading.current_thread():
            self._reader.join(5)
        self._sock.close()
