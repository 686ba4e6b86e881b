package zygote

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SocketEnv names the environment variable that DialDefault reads.
const SocketEnv = "ZYGOTE_SOCKET"

// clientName is sent in Hello, for the daemon's logs.
const clientName = "go/0.1"

// sendBuffer is SO_SNDBUF: at least twice the largest frame (PROTOCOL.md §1).
const sendBuffer = 512 << 10

// handshakeTimeout bounds the wait for HelloAck; the daemon answers at
// once. A reconnect waits less, so that its attempts stay bounded.
const (
	handshakeTimeout          = 10 * time.Second
	reconnectHandshakeTimeout = time.Second
)

// ErrClosed is returned for calls on, or pending on, a Client that Close closed.
var ErrClosed = errors.New("zygote: client closed")

// ConnectionError reports that the connection to the daemon failed or was
// closed by the daemon; every pending and later call on the Client fails
// with it.
type ConnectionError struct {
	// Reason says what happened, e.g. "the daemon closed the connection".
	Reason string
	// Err is the underlying error, if any.
	Err error
}

func (e *ConnectionError) Error() string {
	if e.Err != nil {
		return "zygote: connection to the daemon lost: " + e.Reason + ": " + e.Err.Error()
	}
	return "zygote: connection to the daemon lost: " + e.Reason
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// lostReason is why a connection ended, without the "connection lost"
// prefix, to build a longer ConnectionError from.
func lostReason(err error) string {
	var ce *ConnectionError
	if errors.As(err, &ce) {
		if ce.Err != nil {
			return ce.Reason + ": " + ce.Err.Error()
		}
		return ce.Reason
	}
	return err.Error()
}

// ProtocolError is a frame that broke the protocol, or a reply that was
// not the one expected. It names what was expected and what arrived.
type ProtocolError struct {
	Expected string
	Got      string
}

func (e *ProtocolError) Error() string {
	return "zygote: protocol error: expected " + e.Expected + ", got " + e.Got
}

// Client is a connection to a zygote daemon. It is safe for use by any
// number of goroutines: their requests are multiplexed over the connection,
// and no lock is held while a request waits for its reply.
//
// A Client made by Dial or DialDefault reconnects on its own: when the
// daemon went away (a crash, a restart), the next call dials the same path
// again, up to ReconnectAttempts times with a growing pause, before it
// fails. Children started before the loss keep their pidfd: Signal and
// Kill still work, and Wait reads the exit status from the pidfd (see
// Cmd.Wait). A Client of LaunchPrivate cannot reconnect: its zygote was
// started for it alone.
type Client struct {
	path   string // the socket, "" for a private zygote
	nextID atomic.Uint64

	cur    atomic.Pointer[connection]
	dialMu sync.Mutex // held by the goroutine reconnecting
	// lastFail is when reconnecting last gave up and why, under dialMu:
	// callers that queued behind that attempt fail with it at once.
	lastFail    time.Time
	lastFailErr error

	closed    atomic.Bool
	closeOnce sync.Once

	settingsMu sync.Mutex
	settings   *processSettings

	// private is the zygote process of LaunchPrivate, reaped after Close.
	private *os.Process
}

// ReconnectAttempts bounds how often a Client of Dial dials its socket
// again once the daemon is gone, pausing ReconnectBackoff, then twice
// that, and so on up to ReconnectMaxPause, between attempts: 10 attempts
// over about 4.6 s by default, the schedule of the Rust and Python
// clients, and at most a second more per attempt for a daemon that
// accepts but does not answer. Set them before any Client is in use.
var (
	ReconnectAttempts = 10
	ReconnectBackoff  = 25 * time.Millisecond
	ReconnectMaxPause = time.Second
)

// connection is one connected socket and its in-flight requests. A Client
// replaces it when it reconnects; a started child keeps the one it was
// spawned on, whose end tells its Wait that no exit notice will come.
//
// There is no reader goroutine. A goroutine that waits for a reply reads
// the socket itself when no other goroutine is reading (it holds the
// reader role), and hands the frames that answer other requests to their
// goroutines: the netpoller wakes the goroutine that waits, and a reply
// to it needs no hand-off between goroutines, which costs a wake-up and,
// with an idle P, a futex wake of another thread (see BENCHMARKS.md's Go
// benchmark). Frames nobody waits for (the exit of a child not yet
// waited for, the daemon's end) are read by a sweep that runs when
// requests are outstanding and nobody reads, at most sweepMax apart.
type connection struct {
	sock   *socket
	limits limits
	server string
	// protocol is the version the daemon answered in; features names the
	// optional features it offers (none in version 1).
	protocol uint32
	features []string

	mu      sync.Mutex
	pending map[uint64]*pending // nil once the connection is finished
	err     error               // set once, when the connection is finished
	reading bool                // a goroutine holds the reader role
	waiters []*pending          // goroutines parked in wait, not reading

	// The reader role's state, used only by its holder: set up once, so
	// that reading allocates nothing.
	bufs    *recvBuffers
	readFn  func(fd uintptr) bool // c.readCallback
	rdFor   *pending              // stop once rdReady(rdFor) holds; nil: never
	rdReady func(*pending) bool
	rdBlock bool  // wait for frames; otherwise stop when none is queued
	rdFail  error // why reading stopped early
	rdFound bool  // a frame was read

	sweep      *time.Timer // the sweep, while armed
	sweepArmed bool
	sweepDelay time.Duration

	done    chan struct{} // closed when the connection is finished
	closing atomic.Bool   // Client.Close closed it
}

// The sweep's delay: sweepMin after a sweep found frames, doubling up to
// sweepMax while sweeps find none.
const (
	sweepMin = 20 * time.Millisecond
	sweepMax = time.Second
)

// pending is one request awaiting replies. Its fields are guarded by its
// connection's mu.
type pending struct {
	spawn    bool
	deferred bool          // a spawn with defer_spawned: Exited may be its first reply
	first    reply         // the first reply; first.msg is nil until it arrives
	exit     *exitNotice   // spawns only: the Exited notice
	wake     chan struct{} // capacity 1: sent to when it leaves waiters; made when it first parks
	waitIdx  int           // its index in waiters, -1 when not parked
}

func newPending(spawn bool) *pending {
	return &pending{spawn: spawn, waitIdx: -1}
}

// hasFirst and hasExit are the conditions wait waits for.
func hasFirst(p *pending) bool { return p.first.msg != nil }
func hasExit(p *pending) bool  { return p.exit != nil }

type reply struct {
	msg *serverMessage
	fds []int // close-on-exec; the receiver owns them
}

// DefaultSocketPath is where a zygote started with defaults listens:
// $XDG_RUNTIME_DIR/zygote.sock for a non-root user whose XDG_RUNTIME_DIR is
// set, /run/zygote/zygote.sock otherwise.
func DefaultSocketPath() string {
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" && os.Geteuid() != 0 {
		return filepath.Join(dir, "zygote.sock")
	}
	return "/run/zygote/zygote.sock"
}

// DialDefault connects to the zygote named by $ZYGOTE_SOCKET, or else to
// DefaultSocketPath.
func DialDefault() (*Client, error) {
	if path := os.Getenv(SocketEnv); path != "" {
		return Dial(path)
	}
	return Dial(DefaultSocketPath())
}

// defaultClient is the package's own Client, dialled on first use.
var defaultClient struct {
	mu     sync.Mutex
	client *Client
}

// DefaultClient is the Client of the package-level Command and
// CommandContext, and of Cmd literals (&Cmd{Path: ...}): dialled on first
// use as DialDefault does ($ZYGOTE_SOCKET, else DefaultSocketPath), as
// Python's default client is. A dial that fails is tried again on the
// next use; once connected, the Client reconnects on its own after the
// daemon is lost, as every Client of Dial does. Closing it is allowed:
// the next use dials a new one.
func DefaultClient() (*Client, error) {
	defaultClient.mu.Lock()
	defer defaultClient.mu.Unlock()
	if c := defaultClient.client; c != nil && !c.closed.Load() {
		return c, nil
	}
	c, err := DialDefault()
	if err != nil {
		return nil, err
	}
	defaultClient.client = c
	return c, nil
}

// Dial connects to the zygote listening at path and completes the handshake.
func Dial(path string) (*Client, error) {
	conn, err := dialConnection(path, handshakeTimeout)
	if err != nil {
		return nil, err
	}
	c := &Client{path: path}
	c.cur.Store(conn)
	return c, nil
}

func dialConnection(path string, timeout time.Duration) (*connection, error) {
	sock, err := dialSocket(path)
	if err != nil {
		return nil, fmt.Errorf("zygote: connecting to %s (is the daemon running? start it with `zygote serve`, or set %s): %w", path, SocketEnv, err)
	}
	conn, err := newConnection(sock, timeout)
	if err != nil {
		return nil, fmt.Errorf("zygote: handshake with %s: %w", path, err)
	}
	return conn, nil
}

// newConnection takes over sock and shakes hands.
func newConnection(sock *socket, timeout time.Duration) (*connection, error) {
	// The kernel caps this at net.core.wmem_max; that is not an error.
	_ = sock.setSendBuffer(sendBuffer)
	c := &connection{
		sock:       sock,
		limits:     limits{MaxFrameBytes: 262144, MaxFdsPerFrame: 64},
		pending:    make(map[uint64]*pending),
		done:       make(chan struct{}),
		sweepDelay: sweepMin,
	}
	if err := c.handshake(timeout); err != nil {
		sock.close()
		return nil, err
	}
	c.bufs = c.newRecvBuffers()
	c.readFn = c.readCallback
	return c, nil
}

func (c *connection) handshake(timeout time.Duration) error {
	offered := helloVersion.Load()
	frame, _ := encodeClient(&clientMessage{Hello: &hello{ProtocolVersion: offered, Client: clientName}})
	if err := c.send(frame, nil); err != nil {
		return err
	}
	_ = c.sock.setReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.sock.setReadDeadline(time.Time{}) }()
	m, fds, err := c.recv(c.newRecvBuffers())
	closeFds(fds)
	if err != nil {
		return err
	}
	switch {
	case m.HelloAck != nil:
		// The daemon answers in the newest version both know: ours or
		// older, never one we did not offer.
		if v := m.HelloAck.ProtocolVersion; v < oldestProtocolVersion || v > offered {
			return &ProtocolError{Expected: fmt.Sprintf("HelloAck for protocol version %d to %d", oldestProtocolVersion, offered),
				Got: fmt.Sprintf("HelloAck for version %d", v)}
		}
		if len(fds) != 0 {
			return &ProtocolError{Expected: "HelloAck without fds", Got: fmt.Sprintf("%d fds", len(fds))}
		}
		c.limits = m.HelloAck.Limits
		c.server = m.HelloAck.ServerVersion
		c.protocol = m.HelloAck.ProtocolVersion
		c.features = m.HelloAck.Features
		return nil
	case m.ProtocolError != nil:
		return fmt.Errorf("the daemon refused the connection: %s: %s", m.ProtocolError.Kind, m.ProtocolError.Message)
	default:
		return &ProtocolError{Expected: "HelloAck", Got: m.name()}
	}
}

// helloVersion is the version Hello offers: protocolVersion, lowered by
// tests to talk to a real daemon as a client of an older version does,
// in the layouts a daemon of that version answers in.
var helloVersion = func() *atomic.Uint32 {
	var v atomic.Uint32
	v.Store(protocolVersion)
	return &v
}()

// ServerVersion is the daemon's version, from the latest handshake.
func (c *Client) ServerVersion() string { return c.cur.Load().server }

// ProtocolVersion is the protocol version spoken with the daemon since the
// latest handshake: the newest that both this package and the daemon know.
func (c *Client) ProtocolVersion() uint32 { return c.cur.Load().protocol }

// Features names the optional features the daemon offers ("cgroups",
// "pty", "large_args", ...), from the latest handshake. A request using a
// feature the daemon does not offer fails with EOPNOTSUPP and a message
// naming it.
func (c *Client) Features() []string { return slices.Clone(c.cur.Load().features) }

// Offers reports whether the daemon offers the optional feature name.
func (c *Client) Offers(name string) bool { return slices.Contains(c.cur.Load().features, name) }

// connection returns the live connection, reconnecting first when the
// daemon went away and this Client may redial.
func (c *Client) connection() (*connection, error) {
	conn := c.cur.Load()
	if !conn.finished() {
		return conn, nil
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if c.path == "" {
		return nil, conn.connErr()
	}
	return c.reconnect(conn)
}

// reconnect dials the socket again, with bounded retries and backoff.
// One goroutine dials; the others wait for it and share its result.
func (c *Client) reconnect(lost *connection) (*connection, error) {
	queued := time.Now()
	c.dialMu.Lock()
	defer c.dialMu.Unlock()
	if conn := c.cur.Load(); conn != lost && !conn.finished() {
		return conn, nil
	}
	if c.lastFail.After(queued) {
		return nil, c.lastFailErr
	}
	pause := ReconnectBackoff
	began := time.Now()
	var err error
	for attempt := 0; attempt < max(ReconnectAttempts, 1); attempt++ {
		if attempt > 0 {
			time.Sleep(pause)
			pause = min(pause*2, max(ReconnectMaxPause, ReconnectBackoff))
		}
		if c.closed.Load() {
			return nil, ErrClosed
		}
		var conn *connection
		if conn, err = dialConnection(c.path, reconnectHandshakeTimeout); err == nil {
			c.cur.Store(conn)
			if c.closed.Load() {
				// Close ran while we dialed: it may have missed this one.
				conn.close()
				return nil, ErrClosed
			}
			return conn, nil
		}
	}
	c.lastFail = time.Now()
	c.lastFailErr = &ConnectionError{
		Reason: fmt.Sprintf("%s; reconnecting to %s failed %d times over %.1f s", lostReason(lost.connErr()), c.path,
			max(ReconnectAttempts, 1), time.Since(began).Seconds()),
		Err: err,
	}
	return nil, c.lastFailErr
}

// finished reports whether the connection has ended.
func (c *connection) finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// close ends the connection as Client.Close does. A goroutine holding the
// reader role sees the socket closed and finishes the connection; without
// one, close finishes it.
func (c *connection) close() {
	c.closing.Store(true)
	c.sock.close()
	c.mu.Lock()
	if !c.reading {
		c.finishLocked(ErrClosed)
	}
	c.mu.Unlock()
	<-c.done
}

// send writes one frame with fds attached, without blocking other senders
// for longer than the sendmsg call.
func (c *connection) send(frame []byte, fds []int) error {
	if len(frame) > int(c.limits.MaxFrameBytes) {
		return fmt.Errorf("zygote: request is %d bytes, over the daemon's frame limit of %d bytes (arguments and environment too large)", len(frame), c.limits.MaxFrameBytes)
	}
	if len(fds) > int(c.limits.MaxFdsPerFrame) {
		return fmt.Errorf("zygote: request passes %d fds, over the daemon's limit of %d per frame", len(fds), c.limits.MaxFdsPerFrame)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	op := sendOps.Get().(*sendOp)
	op.sock, op.frame, op.oob = c.sock, frame, oob
	err := c.sock.send(op)
	errno := op.errno
	op.sock, op.frame, op.oob = nil, nil, nil
	sendOps.Put(op)
	if err == nil && errno != 0 {
		err = errno
	}
	if err != nil {
		return &ConnectionError{Reason: "sending a request", Err: err}
	}
	return nil
}

// framePool holds encoding buffers for requests: the kernel has copied a
// frame once sendmsg returns, and a spawn request (the environment,
// mostly) is a few KiB that would otherwise be allocated and zeroed per
// spawn. Buffers over maxPooledFrame are left to the collector.
var framePool sync.Pool

const maxPooledFrame = 64 << 10

func getFrameBuf() []byte {
	if p, ok := framePool.Get().(*[]byte); ok {
		return *p
	}
	return nil
}

func putFrameBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledFrame {
		return
	}
	b = b[:0]
	framePool.Put(&b)
}

// recvBuffers are one reader's frame and control buffers, reused: the
// decoder copies what it keeps.
// Its msghdr is set up once: recvmsg(2) is called raw, without
// syscall.Recvmsg's peer address, which a connected socket does not need
// and which costs an allocation per frame.
type recvBuffers struct {
	buf, oob []byte
	iov      syscall.Iovec
	msg      syscall.Msghdr
}

func (c *connection) newRecvBuffers() *recvBuffers {
	b := &recvBuffers{
		buf: make([]byte, c.limits.MaxFrameBytes+1),
		oob: make([]byte, syscall.CmsgSpace(int(c.limits.MaxFdsPerFrame)*4)),
	}
	b.iov.Base = &b.buf[0]
	b.iov.SetLen(len(b.buf))
	b.msg.Iov = &b.iov
	b.msg.Iovlen = 1
	b.msg.Control = &b.oob[0]
	return b
}

// recv reads one frame and the fds that came with it, close-on-exec,
// waiting for it.
func (c *connection) recv(b *recvBuffers) (*serverMessage, []int, error) {
	var m *serverMessage
	var fds []int
	var recvErr error
	err := c.sock.read(func(fd uintptr) bool {
		m, fds, recvErr = c.recvOne(fd, b)
		return recvErr != syscall.EAGAIN
	})
	if err != nil {
		return nil, nil, &ConnectionError{Reason: "receiving", Err: err}
	}
	return m, fds, recvErr
}

// recvOne reads one frame from the socket fd without waiting; the error
// is syscall.EAGAIN when none is queued.
func (c *connection) recvOne(fd uintptr, b *recvBuffers) (*serverMessage, []int, error) {
	buf, oob := b.buf, b.oob
	b.msg.SetControllen(len(oob))
	b.msg.Flags = 0
	r, errno := rawRecvmsg(fd, &b.msg, syscall.MSG_CMSG_CLOEXEC)
	if errno == syscall.EAGAIN {
		return nil, nil, syscall.EAGAIN
	}
	if errno != 0 {
		return nil, nil, &ConnectionError{Reason: "receiving", Err: errno}
	}
	n, oobn, flags := r, int(b.msg.Controllen), int(b.msg.Flags)
	fds, fdErr := parseFds(oob[:oobn])
	if flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
		closeFds(fds)
		return nil, nil, &ProtocolError{Expected: fmt.Sprintf("a frame of at most %d bytes and %d fds", c.limits.MaxFrameBytes, c.limits.MaxFdsPerFrame), Got: "a truncated frame"}
	}
	if fdErr != nil {
		closeFds(fds)
		return nil, nil, fdErr
	}
	if n == 0 && len(fds) == 0 {
		return nil, nil, &ConnectionError{Reason: "the daemon closed the connection"}
	}
	m, err := decodeServerIn(buf[:n], c.protocol)
	if err != nil {
		closeFds(fds)
		return nil, nil, &ProtocolError{Expected: "a well-formed ServerMessage", Got: "a malformed frame (" + err.Error() + ")"}
	}
	return m, fds, nil
}

func parseFds(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, &ProtocolError{Expected: "SCM_RIGHTS control data", Got: "unparsable control data"}
	}
	if len(msgs) == 1 {
		// The usual case, without the copy into a second slice.
		fds, err := syscall.ParseUnixRights(&msgs[0])
		if err == nil {
			return fds, nil
		}
	}
	var all []int
	var bad error
	for _, msg := range msgs {
		fds, err := syscall.ParseUnixRights(&msg)
		if err != nil {
			bad = &ProtocolError{Expected: "SCM_RIGHTS control data", Got: fmt.Sprintf("control message level %d type %d", msg.Header.Level, msg.Header.Type)}
			continue
		}
		all = append(all, fds...)
	}
	return all, bad
}

func closeFds(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// pipeEnd wraps a received pipe end, non-blocking so that reads and
// writes use the runtime's poller and Close interrupts them.
func pipeEnd(fd int) *os.File {
	_ = syscall.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), "zygote-pipe")
}

// replyID is the id a daemon frame answers, and whether it has one.
func replyID(m *serverMessage) (uint64, bool) {
	switch {
	case m.Spawned != nil:
		return m.Spawned.ID, true
	case m.SpawnFailed != nil:
		return m.SpawnFailed.ID, true
	case m.Exited != nil:
		return m.Exited.ID, true
	case m.SignalSent != nil:
		return m.SignalSent.ID, true
	case m.RequestFailed != nil:
		return m.RequestFailed.ID, true
	case m.Status != nil:
		return m.Status.ID, true
	case m.TemplateReady != nil:
		return m.TemplateReady.ID, true
	case m.Templates != nil:
		return m.Templates.ID, true
	}
	return 0, false
}

// wait returns once ready(p) holds or the connection has ended. While no
// other goroutine reads the socket, it reads and dispatches frames itself
// (see connection); otherwise it parks until a reply to it arrives, the
// reader role is free, or the connection ends.
func (c *connection) wait(p *pending, ready func(*pending) bool) error {
	c.mu.Lock()
	for {
		if ready(p) {
			c.mu.Unlock()
			return nil
		}
		if c.pending == nil {
			err := c.errLocked()
			c.mu.Unlock()
			return err
		}
		if !c.reading {
			c.reading = true
			c.mu.Unlock()
			err := c.readFrames(p, ready, true)
			c.mu.Lock()
			c.releaseReaderLocked(err)
			continue
		}
		if p.wake == nil {
			p.wake = make(chan struct{}, 1)
		}
		p.waitIdx = len(c.waiters)
		c.waiters = append(c.waiters, p)
		c.mu.Unlock()
		<-p.wake
		c.mu.Lock()
	}
}

// readFrames reads and dispatches frames, under the reader role, until
// ready(p) (checked under mu after each frame) holds, an error, or, when
// block is false, no frame is queued. p may be nil: no frame stops it.
func (c *connection) readFrames(p *pending, ready func(*pending) bool, block bool) error {
	c.rdFor, c.rdReady, c.rdBlock, c.rdFail, c.rdFound = p, ready, block, nil, false
	err := c.sock.read(c.readFn)
	fail := c.rdFail
	c.rdFor, c.rdReady, c.rdFail = nil, nil, nil
	if fail == nil && err != nil {
		fail = &ConnectionError{Reason: "receiving", Err: err}
	}
	return fail
}

// readCallback is readFrames' work inside socket.read: returning false
// waits for the socket to become readable within the same Read call,
// which keeps the poller's readiness, so no frame that arrives meanwhile
// is missed.
func (c *connection) readCallback(fd uintptr) bool {
	for {
		m, fds, err := c.recvOne(fd, c.bufs)
		if err == syscall.EAGAIN {
			return !c.rdBlock
		}
		if err == nil {
			c.rdFound = true
			c.mu.Lock()
			err = c.dispatchLocked(m, fds)
			stop := err == nil && c.rdFor != nil && c.rdReady(c.rdFor)
			c.mu.Unlock()
			if stop {
				return true
			}
		}
		if err != nil {
			c.rdFail = err
			return true
		}
	}
}

// releaseReaderLocked gives up the reader role after a read that ended
// with err: it finishes the connection on an error (or after Close), and
// otherwise passes the role to a parked goroutine, or arms the sweep.
func (c *connection) releaseReaderLocked(err error) {
	c.reading = false
	if err == nil && c.closing.Load() {
		err = ErrClosed
	}
	switch {
	case err != nil:
		c.finishLocked(err)
	case len(c.waiters) > 0:
		c.unparkLocked(c.waiters[len(c.waiters)-1])
	case len(c.pending) > 0 && !c.sweepArmed:
		c.sweepArmed = true
		if c.sweep == nil {
			c.sweep = time.AfterFunc(c.sweepDelay, c.sweepNow)
		} else {
			c.sweep.Reset(c.sweepDelay)
		}
	}
}

// sweepNow reads what is queued when nobody reads: exit notices of
// children nobody waits for yet, and the daemon's end.
func (c *connection) sweepNow() {
	c.mu.Lock()
	c.sweepArmed = false
	if c.pending == nil || c.reading {
		c.mu.Unlock()
		return
	}
	c.reading = true
	c.mu.Unlock()
	err := c.readFrames(nil, nil, false)
	found := c.rdFound
	c.mu.Lock()
	if found {
		c.sweepDelay = sweepMin
	} else {
		c.sweepDelay = min(2*c.sweepDelay, sweepMax)
	}
	c.releaseReaderLocked(err)
	c.mu.Unlock()
}

// unparkLocked takes p off the waiters and wakes it.
func (c *connection) unparkLocked(p *pending) {
	i, last := p.waitIdx, len(c.waiters)-1
	c.waiters[i] = c.waiters[last]
	c.waiters[i].waitIdx = i
	c.waiters[last] = nil
	c.waiters = c.waiters[:last]
	p.waitIdx = -1
	p.wake <- struct{}{}
}

// finishLocked ends the connection once: every pending request fails with
// fail, and every parked goroutine wakes to see it.
func (c *connection) finishLocked(fail error) {
	if c.pending == nil {
		return
	}
	if c.closing.Load() {
		fail = ErrClosed
	} else if pe, ok := fail.(*ProtocolError); ok {
		fail = &ConnectionError{Reason: "the daemon sent a bad frame; connection closed", Err: pe}
	}
	c.err = fail
	c.pending = nil
	for len(c.waiters) > 0 {
		c.unparkLocked(c.waiters[len(c.waiters)-1])
	}
	if c.sweep != nil {
		c.sweep.Stop()
	}
	c.sock.close()
	close(c.done)
}

// dispatchLocked files a frame with the request it answers and wakes that
// request's goroutine if it is parked.
func (c *connection) dispatchLocked(m *serverMessage, fds []int) error {
	if m.ProtocolError != nil {
		closeFds(fds)
		return &ConnectionError{Reason: fmt.Sprintf("the daemon reported a protocol error and closed the connection: %s: %s", m.ProtocolError.Kind, m.ProtocolError.Message)}
	}
	id, ok := replyID(m)
	if !ok {
		closeFds(fds)
		return &ProtocolError{Expected: "a reply to a request", Got: m.name()}
	}
	p := c.pending[id]
	if p == nil {
		closeFds(fds)
		return &ProtocolError{Expected: "a reply to a pending request", Got: fmt.Sprintf("%s for unknown id %d", m.name(), id)}
	}
	switch {
	case m.Exited != nil:
		// A deferred spawn whose child ended within the window gets no
		// Spawned: its Exited is both its first reply and its exit.
		if !p.spawn || (!hasFirst(p) && !p.deferred) {
			closeFds(fds)
			return &ProtocolError{Expected: "Exited only for a spawned child", Got: fmt.Sprintf("Exited for request %d", id)}
		}
		closeFds(fds)
		delete(c.pending, id)
		if !hasFirst(p) {
			p.first = reply{msg: m}
		}
		p.exit = m.Exited
	case hasFirst(p):
		closeFds(fds)
		return &ProtocolError{Expected: "one reply per request", Got: fmt.Sprintf("a second reply (%s) to request %d", m.name(), id)}
	default:
		p.first = reply{msg: m, fds: fds}
		if m.Spawned == nil {
			delete(c.pending, id)
		}
	}
	if p.waitIdx >= 0 {
		c.unparkLocked(p)
	}
	return nil
}

// register reserves an id for a request and its replies on the live
// connection, reconnecting first if need be. deferred marks a spawn with
// defer_spawned.
func (c *Client) register(spawn, deferred bool) (*connection, uint64, *pending, error) {
	id := c.nextID.Add(1)
	p := newPending(spawn)
	p.deferred = deferred
	for attempt := 0; ; attempt++ {
		conn, err := c.connection()
		if err != nil {
			return nil, 0, nil, err
		}
		conn.mu.Lock()
		if conn.pending != nil {
			conn.pending[id] = p
			conn.mu.Unlock()
			return conn, id, p, nil
		}
		err = conn.errLocked()
		conn.mu.Unlock()
		if attempt > 0 {
			return nil, 0, nil, err
		}
		// The connection ended between connection() and here (done is
		// closed with it), so the next connection() reconnects.
		<-conn.done
	}
}

// request registers and sends a request, and returns what to await its
// replies on. A send that finds the daemon just gone (its reader has not
// seen the end yet) is retried once on a new connection: nothing of it
// reached the daemon.
func (c *Client) request(spawn, deferred bool, build func(id uint64) *clientMessage, fds []int) (*connection, *pending, error) {
	for attempt := 0; ; attempt++ {
		conn, id, p, err := c.register(spawn, deferred)
		if err != nil {
			return nil, nil, err
		}
		msg := build(id)
		err = conn.refuseUnoffered(msg)
		var frame []byte
		if err == nil {
			frame, err = encodeClientTo(getFrameBuf(), msg, conn.protocol)
		}
		if err == nil {
			err = conn.send(frame, fds)
		}
		putFrameBuf(frame)
		if err == nil {
			return conn, p, nil
		}
		conn.unregister(id)
		// A send that found the connection already finished (another
		// goroutine saw the daemon's end first) is retried the same way.
		lost := peerGone(err) || errors.Is(err, os.ErrClosed) && conn.finished() && !c.closed.Load()
		if attempt > 0 || c.path == "" || !lost {
			return nil, nil, err
		}
		// Read the daemon's end (and what it sent before), unless a
		// reader is already at it.
		conn.sweepNow()
		select {
		case <-conn.done:
		case <-time.After(time.Second):
			return nil, nil, err
		}
	}
}

// peerGone reports whether a send failed because the daemon closed its end.
func peerGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ENOTCONN)
}

func (c *connection) unregister(id uint64) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

func (c *connection) errLocked() error {
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

// connErr is the error that ended the connection.
func (c *connection) connErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// await waits for the first reply to a request, or the connection's end.
func (c *connection) await(p *pending) (reply, error) {
	if err := c.wait(p, hasFirst); err != nil {
		return reply{}, err
	}
	return p.first, nil
}

// roundTrip sends a request without fds on the live connection and
// returns its one reply.
func (c *Client) roundTrip(build func(id uint64) *clientMessage) (*serverMessage, error) {
	conn, p, err := c.request(false, false, build, nil)
	if err != nil {
		return nil, err
	}
	return conn.reply(p)
}

// roundTrip sends a request without fds on this connection (which alone
// knows the spawn ids it carried) and returns its one reply.
func (c *connection) roundTrip(id uint64, build func(id uint64) *clientMessage) (*serverMessage, error) {
	p := newPending(false)
	c.mu.Lock()
	if c.pending == nil {
		err := c.errLocked()
		c.mu.Unlock()
		return nil, err
	}
	c.pending[id] = p
	c.mu.Unlock()
	frame, err := encodeClientTo(nil, build(id), c.protocol)
	if err == nil {
		err = c.send(frame, nil)
	}
	if err != nil {
		c.unregister(id)
		return nil, err
	}
	return c.reply(p)
}

// reply awaits the one reply, without fds, to a request.
func (c *connection) reply(p *pending) (*serverMessage, error) {
	r, err := c.await(p)
	if err != nil {
		return nil, err
	}
	closeFds(r.fds)
	if len(r.fds) != 0 {
		return nil, &ProtocolError{Expected: "a reply without fds", Got: fmt.Sprintf("%s with %d fds", r.msg.name(), len(r.fds))}
	}
	return r.msg, nil
}

// Status is the daemon's counters, as `zygote status` prints them.
type Status struct {
	ServerVersion       string
	Pid                 int
	Uptime              time.Duration
	ConnectionsOpen     uint64
	ConnectionsAccepted uint64
	ChildrenRunning     uint64
	SpawnsSucceeded     uint64
	SpawnsFailed        uint64
	// Peers is the use per peer uid: every uid for root (and the daemon's
	// own uid), only its own for any other peer. Empty from a daemon
	// older than protocol version 3.
	Peers []PeerUse
	// Spawners are the daemon's per-uid spawner processes, if it has any.
	Spawners []Spawner
}

// PeerUse is one peer uid's use of the daemon and its share of it.
type PeerUse struct {
	UID              uint32
	Connections      uint64
	Children         uint64 // children running: started, not yet reaped
	ChildrenLimit    uint64 // the uid's share of the child table
	ConnectionsLimit uint64 // the uid's share of the connections
	// SandboxProfile is the profile the policy imposes on this uid, "" for none.
	SandboxProfile string
}

// Spawner is one of the daemon's per-uid spawner processes.
type Spawner struct {
	UID      uint32
	Pid      int
	Spawns   uint64 // spawns served since it started
	Restarts uint64 // times a spawner for this uid was restarted after a crash
}

// Status asks the daemon for its counters.
func (c *Client) Status() (*Status, error) {
	m, err := c.roundTrip(func(id uint64) *clientMessage {
		return &clientMessage{Status: &statusRequest{ID: id}}
	})
	if err != nil {
		return nil, err
	}
	s := m.Status
	if s == nil {
		return nil, &ProtocolError{Expected: "Status", Got: m.name()}
	}
	out := &Status{ServerVersion: s.ServerVersion, Pid: int(s.Pid), Uptime: time.Duration(s.UptimeMillis) * time.Millisecond,
		ConnectionsOpen: s.ConnectionsOpen, ConnectionsAccepted: s.ConnectionsAccepted, ChildrenRunning: s.ChildrenRunning,
		SpawnsSucceeded: s.SpawnsSucceeded, SpawnsFailed: s.SpawnsFailed,
		Peers: make([]PeerUse, 0, len(s.Peers)), Spawners: make([]Spawner, 0, len(s.Spawners))}
	for _, p := range s.Peers {
		out.Peers = append(out.Peers, PeerUse{UID: p.UID, Connections: p.Connections, Children: p.Children,
			ChildrenLimit: p.ChildrenLimit, ConnectionsLimit: p.ConnectionsLimit, SandboxProfile: deref(p.SandboxProfile)})
	}
	for _, sp := range s.Spawners {
		out.Spawners = append(out.Spawners, Spawner{UID: sp.UID, Pid: int(sp.Pid), Spawns: sp.Spawns, Restarts: sp.Restarts})
	}
	return out, nil
}

// signal asks the daemon that spawned it to signal the child of spawn
// spawnID: only that connection knows the spawn id.
func (c *Client) signal(conn *connection, spawnID uint64, sig syscall.Signal) error {
	m, err := conn.roundTrip(c.nextID.Add(1), func(id uint64) *clientMessage {
		return &clientMessage{Signal: &signalRequest{ID: id, SpawnID: spawnID, Signal: int32(sig)}}
	})
	if err != nil {
		return err
	}
	switch {
	case m.SignalSent != nil:
		return nil
	case m.RequestFailed != nil:
		if syscall.Errno(m.RequestFailed.Errno) == syscall.ESRCH {
			return os.ErrProcessDone
		}
		return fmt.Errorf("zygote: signalling the child: %s: %w", m.RequestFailed.Message, syscall.Errno(m.RequestFailed.Errno))
	default:
		return &ProtocolError{Expected: "SignalSent or RequestFailed", Got: m.name()}
	}
}

// Close closes the connection. Children started with kill-on-close get
// their signal from the daemon; the others keep running. Pending calls,
// including Wait on running children, fail with ErrClosed. Close frees
// every fd and goroutine of the Client except those of commands still
// being waited for, which end as their Wait returns.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		// A reconnect in progress stores its connection before it checks
		// closed, so the one loaded here is the last.
		c.cur.Load().close()
		if c.private != nil {
			// The private zygote exits once it has reaped its children;
			// reap it then, without making Close wait for them.
			p := c.private
			go func() { _, _ = p.Wait() }()
		}
	})
	return nil
}
