package zygote

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// The exit status of a child whose daemon is gone, read from its pidfd
// (linux/pidfd.h, Linux 6.15): once the child has exited and its new
// parent (a subreaper, or init) has reaped it, PIDFD_GET_INFO with
// PIDFD_INFO_EXIT returns its wait status.

// pidfdInfo is struct pidfd_info, PIDFD_INFO_SIZE_VER0 (64 bytes): the
// kernel accepts this size from every version that has the ioctl.
type pidfdInfo struct {
	mask     uint64
	cgroupID uint64
	pid      uint32
	tgid     uint32
	ppid     uint32
	ruid     uint32
	rgid     uint32
	euid     uint32
	egid     uint32
	suid     uint32
	sgid     uint32
	fsuid    uint32
	fsgid    uint32
	exitCode int32 // a wait(2) status
}

// The struct must keep the kernel's size, which the ioctl number encodes.
var _ [64]byte = [unsafe.Sizeof(pidfdInfo{})]byte{}

const (
	// pidfdInfoExit is PIDFD_INFO_EXIT.
	pidfdInfoExit = 1 << 3
	// pidfdGetInfo is PIDFD_GET_INFO, _IOWR(0xFF, 11, struct pidfd_info)
	// in the generic ioctl encoding (every architecture but alpha, mips,
	// powerpc and sparc, where the ioctl then fails and Wait reports the
	// lost daemon as on older kernels).
	pidfdGetInfo = 3<<30 | 64<<16 | 0xFF<<8 | 11
)

// reapTimeout bounds the wait, after the child exited, for its new parent
// to reap it: only then does the kernel keep its exit status. init here
// reaps within seconds; a parent that never reaps would hang Wait.
const reapTimeout = time.Minute

// esrchGrace is how long a reaped child's pidfd may read as gone before
// Wait concludes that the kernel keeps no exit status.
const esrchGrace = 200 * time.Millisecond

// errNoExitInfo says the kernel cannot report a reaped child's status.
var errNoExitInfo = errors.New("this kernel does not report a reaped child's exit status (PIDFD_INFO_EXIT needs Linux 6.15)")

// sysPidfdOpen is pidfd_open(2)'s number, the same on every architecture.
const sysPidfdOpen = 434

// waitPidfd waits for the pidfd's process (pid pid) to exit and be
// reaped, and returns its wait status.
func waitPidfd(pidfd, pid int) (syscall.WaitStatus, error) {
	if err := waitExit(pidfd, pid); err != nil {
		return 0, fmt.Errorf("waiting for the exit: %w", err)
	}
	deadline := time.Now().Add(reapTimeout)
	// A child being reaped can read as gone (ESRCH) for a moment before
	// its exit status is kept: only a lasting ESRCH means a kernel that
	// keeps none (6.13, 6.14).
	gone := time.Now().Add(esrchGrace)
	pause := time.Millisecond
	for {
		var info pidfdInfo
		info.mask = pidfdInfoExit
		_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&info)))
		switch {
		case errno == 0 && info.mask&pidfdInfoExit != 0:
			return syscall.WaitStatus(uint32(info.exitCode)), nil
		case errno == syscall.ESRCH && time.Now().Before(gone):
		case errno == syscall.ENOTTY || errno == syscall.EINVAL || errno == syscall.ESRCH:
			// No ioctl (before 6.13), or the child is reaped and the
			// kernel kept nothing (6.13, 6.14).
			return 0, errNoExitInfo
		case errno != 0:
			return 0, fmt.Errorf("ioctl(PIDFD_GET_INFO): %w", errno)
		}
		// It exited but is not reaped yet.
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("it exited, but its new parent did not reap it within %v", reapTimeout)
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// waitExit waits for a pidfd to become readable, which it does when its
// process exits. It waits on the runtime's poller through a pidfd of its
// own, opened non-blocking: the one received shares its open file
// description (and so its O_NONBLOCK flag) with the daemon's. Where that
// cannot be opened (another pid namespace), ppoll(2) waits on this thread.
func waitExit(pidfd, pid int) error {
	if ready, err := pollIn(pidfd, 0); err != nil || ready {
		return err
	}
	if fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), syscall.O_NONBLOCK, 0); errno == 0 {
		own := os.NewFile(fd, "pidfd")
		defer own.Close()
		// The pid named the child when it was opened if the child had
		// not exited after that (only a reaped pid is reused).
		if ready, err := pollIn(pidfd, 0); err != nil || ready {
			return err
		}
		if rc, err := own.SyscallConn(); err == nil {
			var ready bool
			var pollErr error
			err = rc.Read(func(fd uintptr) bool {
				ready, pollErr = pollIn(int(fd), 0)
				return ready || pollErr != nil
			})
			if err == nil {
				return pollErr
			}
		}
	}
	for {
		if ready, err := pollIn(pidfd, time.Second); err != nil || ready {
			return err
		}
	}
}

// pollIn reports whether fd is readable within timeout.
func pollIn(fd int, timeout time.Duration) (bool, error) {
	type pollFd struct {
		fd              int32
		events, revents int16
	}
	const pollIn = 0x1
	p := pollFd{fd: int32(fd), events: pollIn}
	ts := syscall.NsecToTimespec(int64(timeout))
	for {
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return false, os.NewSyscallError("ppoll", errno)
		}
		return n > 0, nil
	}
}
