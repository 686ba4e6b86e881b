package zygote

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// socket is the connection's SOCK_SEQPACKET socket, kept out of the
// runtime's poller. The poller watches every fd for EPOLLOUT too, and a
// Unix socket signals EPOLLOUT each time the daemon reads one of our
// frames: that woke a thread here at every spawn, for nothing, and often
// preempted the daemon at its work (see BENCHMARKS.md's Go benchmark). So
// the socket stays in blocking mode (every call passes MSG_DONTWAIT) and
// the poller watches two epoll instances instead: rd, watching the socket
// for EPOLLIN, and wr, for EPOLLOUT only while a send waits for space.
type socket struct {
	sock *os.File // the socket, blocking mode: never in the poller
	rd   *os.File // epoll instance: sock's EPOLLIN, EPOLLRDHUP
	wr   *os.File // epoll instance: sock's EPOLLOUT while a send waits

	sockRC, rdRC, wrRC syscall.RawConn
	// closed is set by close: the raw conns then fail with the poller's
	// own error, which read and send report as os.ErrClosed.
	closed atomic.Bool

	// read's state, bound once so that a read allocates nothing. One
	// goroutine reads at a time (the connection's reader role).
	readFn    func(fd uintptr) bool // the caller's, for this read
	readDone  bool
	readErr   error
	readOuter func(uintptr) bool // s.readOnRd
	readInner func(uintptr)      // s.readOnSock
}

// newSocket takes over fd, a connected SOCK_SEQPACKET socket, close-on-exec;
// it closes fd when it fails.
func newSocket(fd int) (s *socket, err error) {
	// Blocking mode keeps os.NewFile from adding it to the poller.
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	s = &socket{sock: os.NewFile(uintptr(fd), "zygote-socket")}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.rd, err = newEpoll("zygote-socket-read"); err != nil {
		return nil, err
	}
	if s.wr, err = newEpoll("zygote-socket-write"); err != nil {
		return nil, err
	}
	if err = epollCtl(s.rd, syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN|syscall.EPOLLRDHUP); err != nil {
		return nil, err
	}
	// No events yet: EPOLLERR and EPOLLHUP only, which the kernel always
	// reports.
	if err = epollCtl(s.wr, syscall.EPOLL_CTL_ADD, fd, 0); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		file *os.File
		rc   *syscall.RawConn
	}{{s.sock, &s.sockRC}, {s.rd, &s.rdRC}, {s.wr, &s.wrRC}} {
		if *f.rc, err = f.file.SyscallConn(); err != nil {
			return nil, err
		}
	}
	s.readOuter = s.readOnRd
	s.readInner = s.readOnSock
	return s, nil
}

// newEpoll is a new epoll instance, close-on-exec and non-blocking, in
// the poller (an epoll fd is readable while one of its events is ready).
func newEpoll(name string) (*os.File, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// epollCtl changes what ep watches on fd, both open.
func epollCtl(ep *os.File, op, fd int, events uint32) error {
	rc, err := ep.SyscallConn()
	if err != nil {
		return err
	}
	var ctlErr error
	if err := rc.Control(func(epfd uintptr) {
		ctlErr = rawEpollCtl(epfd, op, fd, events)
	}); err != nil {
		return err
	}
	return ctlErr
}

// rawEpollCtl is epoll_ctl(2), which never blocks.
func rawEpollCtl(epfd uintptr, op, fd int, events uint32) error {
	ev := syscall.EpollEvent{Events: events}
	_, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, epfd, uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	if errno != 0 {
		return os.NewSyscallError("epoll_ctl", errno)
	}
	return nil
}

// read calls fn with the socket's fd until it returns true, waiting for
// the socket to become readable each time it returns false, as
// RawConn.Read does. Only one goroutine may read at a time.
func (s *socket) read(fn func(fd uintptr) bool) error {
	s.readFn, s.readDone, s.readErr = fn, false, nil
	err := s.rdRC.Read(s.readOuter)
	if err == nil {
		err = s.readErr
	}
	s.readFn, s.readErr = nil, nil
	return s.closedErr(err)
}

// closedErr is err, or os.ErrClosed for an error after close.
func (s *socket) closedErr(err error) error {
	if err != nil && s.closed.Load() {
		return os.ErrClosed
	}
	return err
}

func (s *socket) readOnRd(uintptr) bool {
	// Control keeps the socket's fd open (and its number ours) meanwhile.
	if err := s.sockRC.Control(s.readInner); err != nil {
		s.readErr = err
		return true
	}
	return s.readDone
}

func (s *socket) readOnSock(fd uintptr) { s.readDone = s.readFn(fd) }

// send sends one frame with the control data oob, waiting while the
// socket's buffer is full.
func (s *socket) send(op *sendOp) error {
	if err := s.sockRC.Control(op.trySend); err != nil {
		return s.closedErr(err)
	}
	if op.errno != syscall.EAGAIN {
		return nil
	}
	// Rare: requests fill the buffer faster than the daemon reads them.
	err := s.wrRC.Read(op.retry)
	if err == nil && op.armErr != nil {
		err = op.armErr
	}
	op.armErr = nil
	return s.closedErr(err)
}

// sendOp is one send's state, reused through sendOps so that a send
// allocates no closure.
type sendOp struct {
	sock       *socket
	frame, oob []byte
	errno      syscall.Errno
	wrFd       uintptr
	armErr     error
	trySend    func(fd uintptr)        // op.sendOnSock, bound once
	retry      func(wrfd uintptr) bool // op.retryOnWr, bound once
	armAndSend func(fd uintptr)        // op.armAndSendOnSock, bound once
}

var sendOps = sync.Pool{New: func() any {
	op := &sendOp{}
	op.trySend = op.sendOnSock
	op.retry = op.retryOnWr
	op.armAndSend = op.armAndSendOnSock
	return op
}}

func (op *sendOp) sendOnSock(fd uintptr) {
	op.errno = rawSendmsg(fd, op.frame, op.oob)
}

// retryOnWr runs inside wr's Read: it arms wr for EPOLLOUT before it
// tries again, so that space freed in between still wakes it, and
// disarms it once the frame is sent, so that the daemon's reads stop
// waking this process.
func (op *sendOp) retryOnWr(wrfd uintptr) bool {
	op.wrFd = wrfd
	if err := op.sock.sockRC.Control(op.armAndSend); err != nil {
		op.armErr = err
		return true
	}
	return op.armErr != nil || op.errno != syscall.EAGAIN
}

func (op *sendOp) armAndSendOnSock(fd uintptr) {
	if err := rawEpollCtl(op.wrFd, syscall.EPOLL_CTL_MOD, int(fd), syscall.EPOLLOUT|syscall.EPOLLONESHOT); err != nil {
		op.armErr = err
		return
	}
	op.errno = rawSendmsg(fd, op.frame, op.oob)
	if op.errno != syscall.EAGAIN {
		op.armErr = rawEpollCtl(op.wrFd, syscall.EPOLL_CTL_MOD, int(fd), 0)
	}
}

// setReadDeadline bounds read's waits (zero: no bound).
func (s *socket) setReadDeadline(t time.Time) error { return s.rd.SetReadDeadline(t) }

// setSendBuffer sets SO_SNDBUF.
func (s *socket) setSendBuffer(bytes int) error {
	var optErr error
	if err := s.sockRC.Control(func(fd uintptr) {
		optErr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, bytes)
	}); err != nil {
		return err
	}
	return optErr
}

// close closes the socket and its epoll instances; a read or send waiting
// returns os.ErrClosed.
func (s *socket) close() {
	s.closed.Store(true)
	for _, f := range []*os.File{s.sock, s.wr, s.rd} {
		if f != nil {
			f.Close()
		}
	}
}

// dialSocket connects a SOCK_SEQPACKET socket to path. Like net.Dial, it
// does not wait when the daemon's backlog is full (EAGAIN).
func dialSocket(path string) (*socket, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	return newSocket(fd)
}
