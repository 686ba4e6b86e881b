# The program of a warm Python template, passed to the interpreter with
# `-c`; the preloads follow on its command line. Fd 3 is its control
# socket (SOCK_SEQPACKET) to the daemon.
#
# Its first argument is the size of its pool, the preloads follow.
# It imports the preloads, checks that it is still single-threaded,
# freezes the heap, and says "ready". Then, for each frame the daemon
# sends (a child's plan, its fds attached), it hands the plan to a child
# it forked ahead, or clones one, a child that is the daemon's own
# (CLONE_PARENT), and answers its pid; before each request it fills its
# pool. The child sets itself
# up as the plan says, reports each failing step on its report socket
# (or "ok"), waits for the daemon's "go", and runs the program as
# `python ARGS` would.
#
# Kept to the standard library and to CPython 3.8.

import _io
import builtins
import ctypes
import fcntl
import gc
import importlib
import importlib.machinery
import io
import json
import os
import platform
import resource
import runpy
import signal
import socket
import sys
import threading
import types

CONTROL_FD = 3
MAX_FRAME = 256 * 1024 + 1
MAX_FDS = 64
CLONE_PARENT = 0x00008000
CLONE_VM = 0x00000100
SYS_CLOSE_RANGE = 436
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
RLIM_MAX = (1 << 64) - 1
# Linux's RLIM_NLIMITS, which the resource module does not export.
RLIMIT_COUNT = 16
# The valid signals, set at start, as plain numbers: valid_signals()
# makes an enum member of each, a fifth of a millisecond per call.
SIGNALS = ()
# Set once the preloads are in: see changed_signals().
TEMPLATE_SIGNALS = 0
# True in a pooled child once it has done what prepare() does.
PREPARED = False
# Set at start: see HandOff.
HAND_OFF = None
# The template's environment and rlimits once the preloads are in, which
# every child starts with: a plan that asks for the same costs nothing.
TEMPLATE_ENV = {}
TEMPLATE_RLIMITS = {}


class StepFailed(Exception):
    def __init__(self, stage, errno, message):
        Exception.__init__(self, message)
        self.stage = stage
        self.errno = errno
        self.message = message


def send(control, message):
    control.sendmsg([json.dumps(message).encode()])


def preload(control, names):
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:
            import traceback

            failed = "preload %s raised:\n%s" % (name, traceback.format_exc())
            send(control, {"failed": failed})
            os._exit(1)
        tasks = len(os.listdir("/proc/self/task"))
        if tasks != 1 or threading.active_count() != 1:
            failed = (
                "preload %s started a thread (%d threads now): a template must stay "
                "single-threaded to fork" % (name, max(tasks, threading.active_count()))
            )
            send(control, {"failed": failed})
            os._exit(1)


# One buffer for every frame: recvmsg() would allocate (and map) a fresh
# one of MAX_FRAME bytes per call.
FRAME = bytearray(MAX_FRAME)


def receive(control):
    space = socket.CMSG_SPACE(MAX_FDS * 4)
    size, ancillary, _flags, _address = control.recvmsg_into(
        [FRAME], space, socket.MSG_CMSG_CLOEXEC
    )
    data = bytes(memoryview(FRAME)[:size])
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                for i in range(0, usable, 4)
            )
    return data, fds


def serve(control, pool_size):
    number = SYS_CLONE.get(platform.machine())
    clone = Cloner(number) if number is not None else None
    # Children forked ahead, each waiting on its socket for a plan: the
    # clone and the interpreter's after-fork work are then done between
    # requests, not while a spawn waits. (pid, the template's end.)
    pool = []
    while True:
        while clone is not None and len(pool) < pool_size:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            forked = clone(lambda: pooled(control, ours, theirs, pool))
            theirs.close()
            if forked < 0:
                ours.close()
                break
            pool.append((forked, ours))
        data, fds = receive(control)
        if not data:
            os._exit(0)
        if clone is None or not fds:
            for fd in fds:
                os.close(fd)
            send(control, {"errno": 38})
            continue
        pid = hand_to_pooled(pool, data, fds)
        if pid is None:
            pid = clone(lambda: child(control, json.loads(data), fds))
        send(control, {"pid": pid} if pid > 0 else {"errno": -pid})
        for fd in fds:
            os.close(fd)


class Cloner:
    """Makes a child that is the daemon's own (CLONE_PARENT), with the
    interpreter's fork bookkeeping (locks, at-fork hooks, random's
    reseed) around it, as os.fork does."""

    def __init__(self, number):
        libc = ctypes.PyDLL(None, use_errno=True)
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.number = number
        self.api = ctypes.pythonapi

    def __call__(self, in_child):
        """The child's pid, or -errno; `in_child` runs in the child and
        never returns."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.api.PyOS_BeforeFork()
        pid = self.syscall(
            ctypes.c_long(self.number),
            ctypes.c_long(CLONE_PARENT | signal.SIGCHLD),
            ctypes.c_long(0),
            ctypes.c_long(0),
            ctypes.c_long(0),
            ctypes.c_long(0),
        )
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
            in_child()
            os._exit(127)
        error = ctypes.get_errno()
        self.api.PyOS_AfterFork_Parent()
        return pid if pid > 0 else -error


class HandOff:
    """Takes a warm child's memory teardown off its exit.

    Exiting, a child tears down its copy of the template's mappings (the
    page tables of every page it shares with the template: ~1.5 ms for
    numpy and pandas) before the daemon hears of its exit. Called last,
    this closes the child's fds (as its exit would) and clones a process
    that shares its memory (CLONE_VM) and only sleeps a moment: the child's
    exit then leaves the memory to it, and its own exit, later, does the
    teardown. Its stack is allocated here, in the template, and shared."""

    STACK_BYTES = 64 * 1024
    # Longer than the child takes from here to its exit's memory release.
    SLEEP_MICROS = 20000

    def __init__(self):
        libc = ctypes.PyDLL(None, use_errno=True)
        self.clone = libc.clone
        self.clone.restype = ctypes.c_int
        self.clone.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_void_p]
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.sleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
        self.stack = ctypes.create_string_buffer(self.STACK_BYTES)
        top = ctypes.addressof(self.stack) + self.STACK_BYTES - 64
        self.top = ctypes.c_void_p(top & ~15)

    def __call__(self):
        try:
            # Another thread could open an fd the sleeper would then hold.
            if len(os.listdir("/proc/self/task")) != 1:
                return
        except OSError:
            return
        closed = self.syscall(
            ctypes.c_long(SYS_CLOSE_RANGE),
            ctypes.c_long(0),
            ctypes.c_long(0xFFFFFFFF),
            ctypes.c_long(0),
        )
        if closed == 0:
            # Failing (a pids limit reached), the exit tears down itself.
            self.clone(self.sleep, self.top, CLONE_VM | signal.SIGCHLD, self.SLEEP_MICROS)


def hand_to_pooled(pool, data, fds):
    """Passes a plan and its fds to a waiting child: its pid, or None
    when none is left alive to take it."""
    while pool:
        pid, ours = pool.pop(0)
        try:
            ours.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, pack_fds(fds))])
            return pid
        except OSError:
            # It is gone (its exit is the daemon's to reap), or the plan
            # does not fit its socket: the next, or a fresh clone.
            pass
        finally:
            ours.close()
    return None


def prepare(control, theirs):
    """What a pooled child can do before its request, so that its request
    waits for less: the template's signals reset, every fd but stdio and
    its own socket closed, and a rehearsal."""
    global PREPARED
    reset_template_signals()
    control.detach()
    close_all_but((0, 1, 2, theirs.fileno()), os.listdir("/proc/self/fd"))
    PREPARED = True
    rehearse()


def rehearse():
    """Runs once, for nothing, the code every request runs. The memory it
    writes (reference counts, caches) is the template's, shared copy-on-
    write: written now, it is copied now, not page fault by page fault
    while a spawn waits."""
    env = [[key.decode("latin-1"), value.decode("latin-1")] for key, value in TEMPLATE_ENV.items()]
    sample = {"args": ["-c", "pass"], "env": env, "ignored_signals": 0, "targets": [0, 1, 2]}
    plan = json.loads(json.dumps(sample))
    reset_signals(plan["ignored_signals"])
    set_environment(plan["env"])
    stdio_streams()
    try:
        exec(compile("raise SystemExit(0)", "<string>", "exec"), vars(types.ModuleType("__main__")))
    except SystemExit as exit:
        exit_code(exit)
    gc.collect()
    flush_files()


def pack_fds(fds):
    return b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)


def pooled(control, ours, theirs, pool):
    """A pooled child: waits for its plan, then is that child; ends
    quietly when the template ends or gives it up."""
    # The template's ends, its own and its older siblings': each must see
    # the template's end close.
    ours.close()
    for _pid, other in pool:
        other.close()
    prepare(control, theirs)
    try:
        data, fds = receive(theirs)
    except OSError:
        os._exit(0)
    if not data:
        os._exit(0)
    theirs.close()
    child(control, json.loads(data), fds)


def raw(text):
    return text.encode("latin-1")


def child(control, plan, fds):
    control.detach()
    # Above every target, where no dup2 of the plan's lands on it.
    floor = max(plan["targets"] + [2]) + 1
    report = socket.socket(fileno=fcntl_dup(fds[0], floor))
    os.close(fds[0])
    try:
        setup(plan, fds[1:], report.fileno())
    except StepFailed as failed:
        fail(report, failed.stage, failed.errno, failed.message)
    except BaseException as error:
        fail(report, "template", 71, "the child's setup failed: %r" % (error,))
    report.sendmsg([b'["ok"]'])
    # The daemon's word that it took the child (and moved it to its
    # cgroup): none means it did not, and the child must not run.
    if report.recv(16) != b"go":
        os._exit(127)
    report.close()
    try:
        run_program([os.fsdecode(raw(arg)) for arg in plan["args"]])
    except SystemExit as exit:
        finish(exit_code(exit))
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        finish(1, interrupted=isinstance(error, KeyboardInterrupt))


def exit_code(exit):
    # As the interpreter reads a SystemExit it was not given to catch.
    code = exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:
        pass
    return 1


def finish(code, interrupted=False):
    """Ends a warm child as the interpreter's shutdown would, minus the
    teardown of the template's modules.

    That teardown touches every object of the preloads, copying the
    template's heap into the child page by page: tens of milliseconds of
    CPU for numpy and pandas, for nothing the program can see. What a
    program can see is kept: non-daemon threads are joined, atexit
    handlers run, the program's own objects are released (their __del__
    runs, files it left open are flushed), and the standard streams are
    flushed, with exit status 120 when stdout cannot be (as python does).
    """
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    import atexit

    atexit._run_exitfuncs()
    main = sys.modules.get("__main__")
    if main is not None:
        main.__dict__.clear()
    # The frozen template heap is out of reach here: only what the child made.
    gc.collect()
    flush_files()
    for stream, failed_code in ((sys.stdout, 120), (sys.stderr, None)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            if failed_code is not None and code == 0:
                code = failed_code
    if interrupted:
        # As python ends on an uncaught KeyboardInterrupt: by SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if HAND_OFF is not None:
        HAND_OFF()
    if interrupted:
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def flush_files():
    """Flushes every file object but the standard streams."""
    # io.IOBase is an ABC whose check walks its subclass tree for every
    # type not seen before: in a fresh child, that is every type.
    for thing in gc.get_objects():
        if isinstance(thing, _io._IOBase) and thing not in (sys.stdout, sys.stderr):
            try:
                if not thing.closed:
                    thing.flush()
            except Exception:
                pass


def fail(report, stage, errno, message):
    try:
        report.sendmsg([json.dumps([stage, errno, message]).encode()])
    finally:
        os._exit(127)


def step(stage, action, *args):
    try:
        return action(*args)
    except OSError as error:
        raise StepFailed(stage, error.errno or 5, "%s: %s" % (stage, error))


def setup(plan, sources, report):
    step("signals", reset_signals, plan["ignored_signals"])
    if plan["new_session"]:
        step("setsid", os.setsid)
    elif plan["process_group"] is not None:
        step("setpgid", os.setpgid, 0, plan["process_group"])
    if plan["umask"] is not None:
        os.umask(plan["umask"])
    for number, soft, hard in plan["rlimits"]:
        if TEMPLATE_RLIMITS.get(number) == (soft, hard):
            continue
        limits = tuple(resource.RLIM_INFINITY if v == RLIM_MAX else v for v in (soft, hard))
        step("setrlimit", resource.setrlimit, number, limits)
    if plan["nice"] is not None:
        step("nice", os.setpriority, os.PRIO_PROCESS, 0, plan["nice"])
    if plan["cpu_affinity"]:
        cpus = [
            word_index * 64 + bit
            for word_index, word in enumerate(plan["cpu_affinity"])
            for bit in range(64)
            if word >> bit & 1
        ]
        step("affinity", os.sched_setaffinity, 0, cpus)
    if plan["oom_score_adj"] is not None:
        step("oom_score_adj", write_oom_score_adj, plan["oom_score_adj"])
    step("dup", place_fds, sources, plan["targets"], report)
    if plan["controlling_terminal"]:
        import termios

        step("setsid", fcntl.ioctl, 0, termios.TIOCSCTTY, 0)
    if plan["cwd"] is not None:
        step("chdir", os.chdir, raw(plan["cwd"]))
    set_environment(plan["env"])
    reopen_stdio()


def reset_signals(ignored):
    if not PREPARED:
        reset_template_signals()
    # Then the request's: ignored, as an exec keeps ignored signals.
    for number in SIGNALS:
        if ignored >> (number - 1) & 1 and number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_IGN)
            except (OSError, ValueError):
                pass


def reset_template_signals():
    """Every disposition the template changed back to its default, then
    what a fresh interpreter sets; an empty signal mask."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for number in SIGNALS:
        if number in (signal.SIGKILL, signal.SIGSTOP) or not TEMPLATE_SIGNALS >> (number - 1) & 1:
            continue
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def changed_signals():
    """The signals this process does not leave at their default, as the
    kernel shows them (one read in place of a sigaction per signal)."""
    changed = 0
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith((b"SigIgn:", b"SigCgt:")):
                changed |= int(line.split()[1], 16)
    return changed


def set_environment(pairs):
    """Makes the environment exactly `pairs`, touching only what differs
    from the template's: usually nothing, as a client's children and its
    template mostly share one environment, and each change is a putenv
    or unsetenv plus both of os.environ's mappings."""
    wanted = {}
    for key, value in pairs:
        wanted[raw(key)] = raw(value)
    if wanted == TEMPLATE_ENV:
        return
    current = os.environb
    for key in [key for key in current if key not in wanted]:
        del current[key]
    for key, value in wanted.items():
        if current.get(key) != value:
            current[key] = value


def write_oom_score_adj(value):
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write(str(value))


def place_fds(sources, targets, report):
    if len(sources) != len(targets):
        raise OSError(22, "the plan's fds do not match its targets")
    # Above every target first, so that no source is overwritten.
    floor = max(targets + [2]) + 1
    moved = []
    for source in sources:
        moved.append(fcntl_dup(source, floor))
        os.close(source)
    for source, target in zip(moved, targets):
        os.dup2(source, target, inheritable=True)
    keep = set(targets)
    keep.add(report)
    for fd in moved:
        if fd not in keep:
            os.close(fd)
    # Every other fd: the template's own (its control socket included).
    # Listed, not closed by range: before 3.10 that is a close per number.
    # A pooled child closed the template's before its request: only
    # stdio's numbers can be left.
    close_all_but(keep, ("0", "1", "2") if PREPARED else os.listdir("/proc/self/fd"))


def close_all_but(keep, names):
    """Closes the fds named (as in /proc/self/fd) that are not in `keep`."""
    for name in names:
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def fcntl_dup(fd, floor):
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def reopen_stdio():
    streams = stdio_streams()
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def stdio_streams():
    """New sys.stdin, sys.stdout and sys.stderr on fds 0-2, made as a
    fresh interpreter makes them."""
    template_out = sys.__stdout__ or sys.stdout
    encoding = getattr(template_out, "encoding", None) or "utf-8"
    errors = getattr(template_out, "errors", None) or "strict"
    # -u or PYTHONUNBUFFERED in the template's environment.
    unbuffered = bool(getattr(template_out, "write_through", False))
    streams = []
    for fd, mode in ((0, "r"), (1, "w"), (2, "w")):
        try:
            tty = os.isatty(fd)
        except OSError:
            tty = False
        raw = io.FileIO(fd, mode, closefd=False)
        buffer = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffer,
            encoding=encoding,
            errors="backslashreplace" if fd == 2 else errors,
            newline="\n",
            line_buffering=tty or fd == 2,
            write_through=unbuffered and mode == "w",
        )
        stream.mode = mode
        streams.append(stream)
    return streams


def fresh_main():
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__loader__ = importlib.machinery.BuiltinImporter
    sys.modules["__main__"] = main
    return main


def run_program(args):
    """Runs `python ARGS`; returns only by raising (SystemExit included)."""
    here = sys._getframe()
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = sys.orig_argv[:1] + args
    first = args[0]
    skip_runpy = False
    try:
        if first == "-c":
            sys.argv = ["-c"] + args[2:]
            sys.path[0] = ""
            main = fresh_main()
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        elif first == "-m":
            sys.argv = ["-m"] + args[2:]
            sys.path[0] = os.getcwd()
            fresh_main()
            runpy._run_module_as_main(args[1], True)
        else:
            sys.argv = list(args)
            main = fresh_main()
            if os.path.isdir(first) or not os.path.isfile(first):
                if not os.path.exists(first):
                    sys.stderr.write(
                        "%s: can't open file %r: [Errno 2] No such file or directory\n"
                        % (sys.executable, first)
                    )
                    raise SystemExit(2)
                sys.path[0] = first
                runpy._run_module_as_main("__main__", False)
            else:
                sys.path[0] = os.path.dirname(os.path.realpath(first))
                skip_runpy = True
                with open(first, "rb") as script:
                    source = script.read()
                main.__file__ = first
                main.__cached__ = None
                exec(compile(source, first, "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException:
        hook = sys.excepthook

        def trimmed(kind, value, tb):
            # Drop this runner's frames: the traceback starts in the program.
            while tb is not None and tb.tb_frame is not here:
                tb = tb.tb_next
            tb = tb.tb_next if tb is not None else None
            while skip_runpy and tb is not None and "runpy" in tb.tb_frame.f_code.co_filename:
                tb = tb.tb_next
            if value is not None:
                value.__traceback__ = tb
            hook(kind, value, tb)

        sys.excepthook = trimmed
        raise
    raise SystemExit(0)


def start():
    control = socket.socket(fileno=CONTROL_FD)
    control.set_inheritable(False)
    pool_size = int(sys.argv[1])
    names = sys.argv[2:]
    sys.argv = [""]
    if sys.version_info < (3, 8) or sys.implementation.name != "cpython":
        failed = "a template needs CPython 3.8 or later; %s is %s %s" % (
            sys.executable,
            sys.implementation.name,
            sys.version.split()[0],
        )
        send(control, {"failed": failed})
        os._exit(1)
    preload(control, names)
    global SIGNALS, TEMPLATE_SIGNALS
    SIGNALS = tuple(int(number) for number in signal.valid_signals())
    TEMPLATE_SIGNALS = changed_signals()
    TEMPLATE_ENV.update(os.environb)
    for number in range(RLIMIT_COUNT):
        try:
            limits = resource.getrlimit(number)
        except (OSError, ValueError):
            continue
        TEMPLATE_RLIMITS[number] = tuple(
            RLIM_MAX if value == resource.RLIM_INFINITY else value for value in limits
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # Its stderr was a pipe the daemon reads while it starts.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    global HAND_OFF
    try:
        HAND_OFF = HandOff()
    except (AttributeError, OSError):
        pass
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()
    send(control, {"ready": os.getpid()})
    serve(control, pool_size)


start()
