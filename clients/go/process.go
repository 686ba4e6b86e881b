package zygote

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// sysPidfdSendSignal is pidfd_send_signal(2)'s number, the same on every
// Linux architecture (the syscall table was unified before it was added).
const sysPidfdSendSignal = 424

// Process is a child started by the zygote. The zygote, not this program,
// is its parent: it is signalled through its pidfd, and its exit status
// arrives from the daemon (see Wait).
type Process struct {
	// Pid is the child's pid in the daemon's pid namespace. Within Run
	// it is 0 until the daemon has reported the child (see Cmd.Run).
	Pid int
	// Sandbox is what confined the child, as the daemon reported it; nil
	// when nothing did (or, for a deferred spawn, until it was reported).
	Sandbox *AppliedSandbox

	client   *Client
	conn     *connection // the connection it was spawned on
	spawnID  uint64
	pending  *pending // its request, which receives the Exited notice
	program  string   // for a StartError that comes to a deferred spawn
	killTree bool     // SIGKILL is the daemon's cgroup.kill
	startErr error    // a deferred spawn failed: there was no child

	// mu guards pidfd: held shared while it is used, exclusively to
	// close it, so that a signal never goes to a reused fd number.
	mu       sync.RWMutex
	pidfd    int  // -1 once Wait has returned or Release was called
	deferred bool // the spawn asked for defer_spawned and adopt has not run
	released bool

	waitOnce  sync.Once
	waitState *ProcessState
	waitErr   error
}

// Pidfd is the child's pidfd, for poll(2) or pidfd_send_signal(2), or -1
// once Wait has returned or Release was called. It is close-on-exec and
// stays owned by the Process: do not close it, and dup it to keep it past
// Wait. It shares its open file description with the daemon's: do not
// set O_NONBLOCK on it.
func (p *Process) Pidfd() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.pidfd
}

// Signal sends sig to the child through its pidfd, so it never reaches a
// process that reused the pid. It returns os.ErrProcessDone once the child
// has exited and been reaped. When this program may not signal the child
// itself (it runs as another user), the daemon sends the signal.
//
// With CgroupOptions.KillTree, SIGKILL asks the daemon to kill the
// child's whole cgroup instead, grandchildren included; if the daemon
// cannot (it is gone), the pidfd still reaches the child.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("os: unsupported signal type")
	}
	if err, done := p.signalDeferred(s); done {
		return err
	}
	if s == syscall.SIGKILL && p.killTree && !p.conn.finished() {
		p.mu.RLock()
		live := p.pidfd >= 0
		p.mu.RUnlock()
		if live && p.client.signal(p.conn, p.spawnID, s) == nil {
			return nil
		}
	}
	p.mu.RLock()
	if p.pidfd < 0 {
		released := p.released
		p.mu.RUnlock()
		if released {
			return errReleased
		}
		return os.ErrProcessDone
	}
	_, _, errno := syscall.Syscall6(sysPidfdSendSignal, uintptr(p.pidfd), uintptr(s), 0, 0, 0, 0)
	p.mu.RUnlock()
	switch {
	case errno == 0:
		return nil
	case errno == syscall.ESRCH:
		return os.ErrProcessDone
	case errno == syscall.EPERM:
		return p.client.signal(p.conn, p.spawnID, s)
	default:
		return os.NewSyscallError("pidfd_send_signal", errno)
	}
}

// signalDeferred signals a deferred spawn's child by spawn id while there
// is no pidfd yet; done is false once there is (or the child's end is
// known), for Signal to carry on. The daemon answers ESRCH both before
// the child started and after it was reaped: the first reply tells them
// apart (PROTOCOL.md §5.6).
func (p *Process) signalDeferred(s syscall.Signal) (err error, done bool) {
	pause := time.Millisecond
	started := false
	for {
		p.mu.RLock()
		deferred, released := p.deferred, p.released
		p.mu.RUnlock()
		switch {
		case !deferred:
			return nil, false
		case released:
			return errReleased, true
		}
		err := p.client.signal(p.conn, p.spawnID, s)
		if !errors.Is(err, os.ErrProcessDone) {
			return err, true
		}
		p.conn.mu.Lock()
		first := p.pending.first.msg
		p.conn.mu.Unlock()
		switch {
		case first == nil:
			// Not started yet.
			time.Sleep(pause)
			pause = min(2*pause, 16*time.Millisecond)
		case first.Spawned != nil && !started:
			// Spawned may have been sent after the ESRCH: the child
			// is known to the daemon now, so once more by id.
			started = true
		default:
			// Exited, SpawnFailed, or reaped after its Spawned.
			return os.ErrProcessDone, true
		}
	}
}

// adopt receives a deferred spawn's first reply: Spawned (the pidfd),
// Exited alone (a child that ended within the window) or SpawnFailed
// (kept in startErr for Run). Wait calls it; an error ends the wait.
func (p *Process) adopt() error {
	if lost := p.conn.wait(p.pending, hasFirst); lost != nil {
		if errors.Is(lost, ErrClosed) {
			return lost
		}
		return &ConnectionError{Reason: fmt.Sprintf("%s; the exit status of %s is lost: Run asked the daemon to defer the child's pidfd, and it was lost before the child was reported, so there is no pidfd to read the status from", lostReason(lost), p.program)}
	}
	// Written under the connection's lock before wait saw it.
	r := p.pending.first
	m := r.msg
	switch {
	case m.Exited != nil:
		closeFds(r.fds)
		p.Pid = int(m.Exited.Pid)
		p.setAdopted(-1)
	case m.Spawned != nil && len(r.fds) == 1:
		p.Pid = int(m.Spawned.Pid)
		p.Sandbox = newAppliedSandbox(m.Spawned.Sandbox)
		p.setAdopted(r.fds[0])
	case m.SpawnFailed != nil:
		closeFds(r.fds)
		f := m.SpawnFailed
		p.startErr = &StartError{Program: p.program, Stage: f.Stage.String(), Errno: syscall.Errno(f.Errno), Message: f.Message}
		p.setAdopted(-1)
		return p.startErr
	default:
		closeFds(r.fds)
		got := m.name()
		if m.Spawned != nil {
			got = fmt.Sprintf("Spawned with %d fds", len(r.fds))
		}
		p.setAdopted(-1)
		return &ProtocolError{Expected: "Spawned with 1 fd, Exited or SpawnFailed", Got: got}
	}
	return nil
}

// setAdopted ends the deferral with the pidfd (-1: none), closing it if
// Release came first.
func (p *Process) setAdopted(pidfd int) {
	p.mu.Lock()
	p.deferred = false
	if p.released && pidfd >= 0 {
		rawClose(pidfd)
		pidfd = -1
	}
	p.pidfd = pidfd
	p.mu.Unlock()
}

// Kill sends SIGKILL to the child.
func (p *Process) Kill() error { return p.Signal(syscall.SIGKILL) }

// Wait waits for the child to exit and returns how it ended, then closes
// the pidfd. A non-zero exit is not an error here (as with os.Process);
// Cmd.Wait, which also waits for the child's I/O, returns an *ExitError
// for it. Wait may be called again, and by Cmd.Wait after it: every call
// returns the same result.
//
// When the connection to the daemon is lost before the exit notice
// arrives (the daemon crashed or was killed), Wait falls back to the
// pidfd: it waits for the child to exit, then reads its exit status with
// the PIDFD_GET_INFO ioctl (Linux 6.15 and later). That status has no
// resource usage (ProcessState.UsageAvailable is false). On older kernels,
// or when the child is not reaped by its new parent within a minute, Wait
// returns the *ConnectionError. After Client.Close, Wait returns ErrClosed
// without waiting.
func (p *Process) Wait() (*ProcessState, error) {
	p.waitOnce.Do(func() {
		p.mu.RLock()
		released := p.released
		p.mu.RUnlock()
		if released {
			p.waitErr = errReleased
			return
		}
		p.waitState, p.waitErr = p.wait()
		if p.waitState != nil {
			p.release()
		}
	})
	return p.waitState, p.waitErr
}

func (p *Process) wait() (*ProcessState, error) {
	p.mu.RLock()
	deferred := p.deferred
	p.mu.RUnlock()
	if deferred {
		if err := p.adopt(); err != nil {
			return nil, err
		}
	}
	lost := p.conn.wait(p.pending, hasExit)
	if lost == nil {
		return newProcessState(p.Pid, p.pending.exit), nil
	}
	if errors.Is(lost, ErrClosed) {
		return nil, lost
	}
	// A duplicate, which Release cannot close under the wait.
	p.mu.RLock()
	dup := -1
	if p.pidfd >= 0 {
		dup, _ = fcntlDupCloexec(p.pidfd)
	}
	p.mu.RUnlock()
	if dup < 0 {
		return nil, lost
	}
	defer syscall.Close(dup)
	status, err := waitPidfd(dup, p.Pid)
	if err != nil {
		return nil, &ConnectionError{Reason: fmt.Sprintf("%s; the exit status of pid %d cannot be read from its pidfd: %v", lostReason(lost), p.Pid, err)}
	}
	return &ProcessState{pid: p.Pid, status: status, noUsage: true}, nil
}

// Release frees the Process's resources (its pidfd) without waiting for
// the child, which runs on; it only needs to be called when Wait is not.
// Afterwards Signal, Kill and Wait fail.
func (p *Process) Release() error {
	p.mu.Lock()
	p.released = true
	p.mu.Unlock()
	p.release()
	return nil
}

func (p *Process) release() {
	p.mu.Lock()
	if p.pidfd >= 0 {
		rawClose(p.pidfd)
		p.pidfd = -1
	}
	p.mu.Unlock()
}

// fcntlDupCloexec is fcntl(F_DUPFD_CLOEXEC).
func fcntlDupCloexec(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

var errReleased = errors.New("os: process already released")

// ProcessState is how a child ended, as the daemon reported it.
type ProcessState struct {
	pid      int
	status   syscall.WaitStatus
	usage    syscall.Rusage
	noUsage  bool // the status came from the pidfd: no rusage
	timedOut bool
	tree     *TreeUsage
}

func newProcessState(pid int, x *exitNotice) *ProcessState {
	s := &ProcessState{pid: pid, timedOut: x.TimedOut}
	if x.Status.Exited != nil {
		s.status = syscall.WaitStatus((uint32(*x.Status.Exited) & 0xff) << 8)
	} else if x.Status.Signaled != nil {
		st := uint32(x.Status.Signaled.Signal) & 0x7f
		if x.Status.Signaled.CoreDumped {
			st |= 0x80
		}
		s.status = syscall.WaitStatus(st)
	}
	s.usage.Utime = syscall.NsecToTimeval(int64(x.Usage.UserMicros) * 1000)
	s.usage.Stime = syscall.NsecToTimeval(int64(x.Usage.SystemMicros) * 1000)
	s.usage.Maxrss = int64(x.Usage.MaxRssKiB)
	if t := x.Tree; t != nil {
		s.tree = &TreeUsage{
			UserTime:   time.Duration(t.UserMicros) * time.Microsecond,
			SystemTime: time.Duration(t.SystemMicros) * time.Microsecond,
			OOMKills:   t.OomKills,
		}
		if t.MemoryPeakBytes != nil {
			s.tree.MemoryPeak = *t.MemoryPeakBytes
		}
		if t.MemoryMax != nil {
			s.tree.MemoryMax = *t.MemoryMax
		}
	}
	return s
}

// TreeUsage is what a child's whole cgroup used, grandchildren included
// (cgroup v2 cpu.stat, memory.peak and memory.events).
type TreeUsage struct {
	// UserTime and SystemTime are the tree's CPU time.
	UserTime, SystemTime time.Duration
	// MemoryPeak is memory.peak in bytes; 0 when the memory controller
	// is not delegated to the zygote.
	MemoryPeak uint64
	// OOMKills counts the tree's processes the OOM killer ended.
	OOMKills uint64
	// MemoryMax is the tree's memory.max in bytes; 0 when unlimited.
	MemoryMax uint64
}

// TreeUsage is what the child's whole cgroup used, or nil when the
// daemon did not report it: it does when the child had a cgroup of its
// own and Options.Cgroup asked for something (reading the cgroup costs
// the daemon time that plain spawns are spared).
func (p *ProcessState) TreeUsage() *TreeUsage { return p.tree }

// OOMKilled reports whether the OOM killer ended a process of the child's
// cgroup (memory.events oom_kill); the child then shows as killed by
// SIGKILL.
func (p *ProcessState) OOMKilled() bool { return p.tree != nil && p.tree.OOMKills > 0 }

// Pid is the child's pid.
func (p *ProcessState) Pid() int { return p.pid }

// Exited reports whether the child called exit.
func (p *ProcessState) Exited() bool { return p.status.Exited() }

// ExitCode is the exit code, or -1 if a signal ended the child.
func (p *ProcessState) ExitCode() int {
	if p == nil {
		return -1
	}
	if !p.status.Exited() {
		return -1
	}
	return p.status.ExitStatus()
}

// Success reports whether the child exited with code 0.
func (p *ProcessState) Success() bool { return p.status.Exited() && p.status.ExitStatus() == 0 }

// Sys is the wait status, a syscall.WaitStatus.
func (p *ProcessState) Sys() any { return p.status }

// SysUsage is the child's resource usage, a *syscall.Rusage with Utime,
// Stime and Maxrss (KiB) filled in; the daemon reports nothing else. It
// is nil when UsageAvailable is false.
func (p *ProcessState) SysUsage() any {
	if p.noUsage {
		return nil
	}
	return &p.usage
}

// UsageAvailable reports whether the resource usage is known. It is not
// when the daemon was lost before it reported the exit, and Wait read the
// exit status from the child's pidfd instead (see Process.Wait); then
// SysUsage is nil and UserTime and SystemTime are 0.
func (p *ProcessState) UsageAvailable() bool { return !p.noUsage }

// UserTime is the child's user CPU time.
func (p *ProcessState) UserTime() time.Duration {
	return time.Duration(p.usage.Utime.Nano())
}

// SystemTime is the child's system CPU time.
func (p *ProcessState) SystemTime() time.Duration {
	return time.Duration(p.usage.Stime.Nano())
}

// TimedOut reports whether the daemon ended the child because its
// Options.Timeout expired.
func (p *ProcessState) TimedOut() bool { return p.timedOut }

// String is "exit status N" or "signal: NAME", as in os.
func (p *ProcessState) String() string {
	if p == nil {
		return "<nil>"
	}
	var res string
	switch {
	case p.status.Exited():
		res = "exit status " + strconv.Itoa(p.status.ExitStatus())
	case p.status.Signaled():
		res = "signal: " + p.status.Signal().String()
	}
	if p.status.CoreDump() {
		res += " (core dumped)"
	}
	if p.status.Signaled() && p.OOMKilled() {
		res += " (killed by the OOM killer"
		if p.tree.MemoryMax != 0 {
			res += ": memory.max " + strconv.FormatUint(p.tree.MemoryMax, 10)
		}
		res += ")"
	}
	if p.timedOut {
		res += " (timed out)"
	}
	return res
}

// ExitError is returned by Wait and Run when the child did not exit with 0.
type ExitError struct {
	*ProcessState
	// Stderr holds the child's standard error, when Output collected it.
	Stderr []byte
}

func (e *ExitError) Error() string { return e.ProcessState.String() }

// StartError is a spawn the daemon refused or that failed in the child
// before exec. errors.Is matches its errno, and exec.ErrNotFound when a
// program named without a slash was not found.
type StartError struct {
	// Program is the program as the Cmd named it.
	Program string
	// Stage is the setup step that failed, e.g. "Exec" or "Chdir", or
	// "LookPath" for Command's own lookup.
	Stage string
	// Errno is the error number (0 for a LookPath error other than
	// not found, such as exec.ErrDot).
	Errno syscall.Errno
	// Message is the daemon's explanation.
	Message string

	cause error // LookPath's error
}

func (e *StartError) Error() string {
	if e.Errno == 0 {
		return fmt.Sprintf("zygote: starting %q failed at %s: %s", e.Program, e.Stage, e.Message)
	}
	return fmt.Sprintf("zygote: starting %q failed at %s: %s (%v)", e.Program, e.Stage, e.Message, e.Errno)
}

// Unwrap gives the errno, and exec.ErrNotFound for a program not found on PATH.
func (e *StartError) Unwrap() []error {
	var errs []error
	if e.Errno != 0 {
		errs = append(errs, e.Errno)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	} else if e.Stage == "Exec" && e.Errno == syscall.ENOENT && !containsSlash(e.Program) {
		errs = append(errs, exec.ErrNotFound)
	}
	return errs
}

func containsSlash(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

// ErrWaitDelay is returned by Wait when the child exited but its I/O did
// not finish within WaitDelay; it is os/exec's own error value.
var ErrWaitDelay = exec.ErrWaitDelay

var errNotStarted = errors.New("exec: not started")
