package zygote

import (
	"syscall"
	"unsafe"
)

// The syscalls of a spawn's path that never block (the socket is
// non-blocking and every call passes MSG_DONTWAIT; close of a pidfd and
// getcwd do no I/O) are made with RawSyscall: syscall.Syscall's
// entersyscall/exitsyscall pair would, when every P is idle as it is
// between replies, wake the runtime's sysmon thread with a futex at each
// call, and sysmon then polls with nanosleep until it sleeps again.

// rawRecvmsg is recvmsg(2) with msg, never waiting.
func rawRecvmsg(fd uintptr, msg *syscall.Msghdr, flags int) (int, syscall.Errno) {
	for {
		r, _, errno := syscall.RawSyscall(syscall.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(msg)), uintptr(flags|syscall.MSG_DONTWAIT))
		if errno != syscall.EINTR {
			return int(r), errno
		}
	}
}

// rawSendmsg sends frame with the control data oob, never waiting.
func rawSendmsg(fd uintptr, frame, oob []byte) syscall.Errno {
	var iov syscall.Iovec
	var msg syscall.Msghdr
	if len(frame) > 0 {
		iov.Base = &frame[0]
		iov.SetLen(len(frame))
		msg.Iov = &iov
		msg.Iovlen = 1
	}
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	for {
		_, _, errno := syscall.RawSyscall(syscall.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), syscall.MSG_NOSIGNAL|syscall.MSG_DONTWAIT)
		if errno != syscall.EINTR {
			return errno
		}
	}
}

// rawClose closes fd, which must not be a file whose release may block
// (a pidfd is fine).
func rawClose(fd int) {
	_, _, _ = syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(fd), 0, 0)
}

// rawGetwd is getcwd(2), the kernel's path of the working directory.
// It tries a small buffer first: Go zeroes a buffer on every call, and
// zeroing PATH_MAX bytes cost more than the system call.
func rawGetwd() (string, error) {
	var small [256]byte
	if s, errno := getcwdInto(small[:]); errno != syscall.ERANGE {
		return s, errnoErr(errno)
	}
	var buf [syscall.PathMax]byte
	s, errno := getcwdInto(buf[:])
	return s, errnoErr(errno)
}

func errnoErr(errno syscall.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}

// getcwdInto is one getcwd(2) into buf.
func getcwdInto(buf []byte) (string, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_GETCWD, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	if errno != 0 {
		return "", errno
	}
	// n counts the terminating NUL; a path not under the root (a
	// directory removed, or outside a chroot) starts with '('.
	if n < 2 || buf[0] != '/' {
		return "", syscall.ENOENT
	}
	return string(buf[:n-1]), 0
}
