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
// arrives from the daemon (see Cmd.Wait).
type Process struct {
	// Pid is the child's pid in the daemon's pid namespace.
	Pid int

	client  *Client
	spawnID uint64

	mu    sync.RWMutex
	pidfd *os.File // nil once Wait has returned
}

// Pidfd is the child's pidfd, for poll(2) or pidfd_send_signal(2), or -1
// once Wait has returned. It is close-on-exec and stays owned by the
// Process: do not close it, and dup it to keep it past Wait.
func (p *Process) Pidfd() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.pidfd == nil {
		return -1
	}
	return int(p.pidfd.Fd())
}

// Signal sends sig to the child through its pidfd, so it never reaches a
// process that reused the pid. It returns os.ErrProcessDone once the child
// has exited and been reaped. When this program may not signal the child
// itself (it runs as another user), the daemon sends the signal.
func (p *Process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("zygote: unsupported signal type %T", sig)
	}
	p.mu.RLock()
	if p.pidfd == nil {
		p.mu.RUnlock()
		return os.ErrProcessDone
	}
	var errno syscall.Errno
	err := withFd(p.pidfd, func(fd int) {
		_, _, errno = syscall.Syscall6(sysPidfdSendSignal, uintptr(fd), uintptr(s), 0, 0, 0, 0)
	})
	p.mu.RUnlock()
	switch {
	case err != nil:
		return err
	case errno == 0:
		return nil
	case errno == syscall.ESRCH:
		return os.ErrProcessDone
	case errno == syscall.EPERM:
		return p.client.signal(p.spawnID, s)
	default:
		return os.NewSyscallError("pidfd_send_signal", errno)
	}
}

// Kill sends SIGKILL to the child.
func (p *Process) Kill() error { return p.Signal(syscall.SIGKILL) }

func (p *Process) release() {
	p.mu.Lock()
	if p.pidfd != nil {
		p.pidfd.Close()
		p.pidfd = nil
	}
	p.mu.Unlock()
}

// withFd runs f with f's raw fd, without putting the file in blocking mode
// as (*os.File).Fd does.
func withFd(file *os.File, f func(fd int)) error {
	rc, err := file.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { f(int(fd)) })
}

// ProcessState is how a child ended, as the daemon reported it.
type ProcessState struct {
	pid      int
	status   syscall.WaitStatus
	usage    syscall.Rusage
	timedOut bool
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
	return s
}

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
// Stime and Maxrss (KiB) filled in; the daemon reports nothing else.
func (p *ProcessState) SysUsage() any { return &p.usage }

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
	// Stage is the setup step that failed, e.g. "Exec" or "Chdir".
	Stage string
	// Errno is the error number.
	Errno syscall.Errno
	// Message is the daemon's explanation.
	Message string
}

func (e *StartError) Error() string {
	return fmt.Sprintf("zygote: starting %q failed at %s: %s (%v)", e.Program, e.Stage, e.Message, e.Errno)
}

// Unwrap gives the errno, and exec.ErrNotFound for a program not found on PATH.
func (e *StartError) Unwrap() []error {
	if e.Stage == "Exec" && e.Errno == syscall.ENOENT && !containsSlash(e.Program) {
		return []error{e.Errno, exec.ErrNotFound}
	}
	return []error{e.Errno}
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

var errNotStarted = errors.New("zygote: not started")
