package zygote

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sockFd is the number of the connection's socket fd.
func sockFd(t *testing.T, conn *connection) int {
	t.Helper()
	fd := -1
	if err := conn.sock.sockRC.Control(func(raw uintptr) { fd = int(raw) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// epollWatches lists, for every epoll instance this process has open, the
// events it watches on fd (from /proc/self/fdinfo: "tfd: FD events: HEX").
func epollWatches(t *testing.T, fd int) []uint32 {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var found []uint32
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.Open(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		lines := bufio.NewScanner(info)
		for lines.Scan() {
			f := strings.Fields(lines.Text())
			if len(f) >= 4 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) && f[2] == "events:" {
				events, err := strconv.ParseUint(f[3], 16, 32)
				if err != nil {
					t.Fatalf("fdinfo line %q: %v", lines.Text(), err)
				}
				found = append(found, uint32(events))
			}
		}
		info.Close()
	}
	return found
}

// The daemon's every read of a request gives the socket's buffer space
// back, which is EPOLLOUT: the runtime's poller, which watches every fd it
// holds for EPOLLOUT too, woke a thread of this process for it at each
// spawn. The socket must be watched for reading alone.
func TestSocketIsWatchedForReadingOnly(t *testing.T) {
	c := dial(t)
	if err := c.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	fd := sockFd(t, c.cur.Load())
	watches := epollWatches(t, fd)
	readers := 0
	for _, events := range watches {
		if events&syscall.EPOLLOUT != 0 {
			t.Errorf("an epoll instance watches the socket (fd %d) for EPOLLOUT (events %#x)", fd, events)
		}
		if events&syscall.EPOLLIN != 0 {
			readers++
		}
	}
	if readers != 1 {
		t.Errorf("%d epoll instances watch the socket (fd %d) for EPOLLIN, want 1 (all: %#x)", readers, fd, watches)
	}
}

// stalledPeer accepts one connection, answers its Hello, then reads
// nothing more until resume is closed; after that it reads want frames
// (or until the connection ends) and reports their count and bytes on got.
func stalledPeer(t *testing.T, resume chan struct{}, want int, got chan [2]int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stalled.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		conn, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 1<<18+1)
		if _, _, _, _, err := conn.ReadMsgUnix(buf, nil); err != nil {
			return
		}
		if _, _, err := conn.WriteMsgUnix(helloAckFrame(), nil, nil); err != nil {
			return
		}
		<-resume
		frames, bytes := 0, 0
		for frames < want {
			n, _, _, _, err := conn.ReadMsgUnix(buf, nil)
			if err != nil || n == 0 {
				got <- [2]int{frames, bytes}
				return
			}
			frames++
			bytes += n
		}
		got <- [2]int{frames, bytes}
	}()
	return path
}

// Frames sent faster than the daemon reads wait for buffer space, and
// all arrive once it reads again; the socket is then watched for reading
// alone again.
func TestSendWaitsForBufferSpace(t *testing.T) {
	// SO_SNDBUF is 512 KiB (the kernel doubles it): 16 frames of 200 KB
	// cannot all fit.
	const frames, size = 16, 200_000
	resume := make(chan struct{})
	got := make(chan [2]int, 1)
	c, err := Dial(stalledPeer(t, resume, frames, got))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := c.cur.Load()
	frame := make([]byte, size)
	sent := make(chan error, 1)
	go func() {
		for i := 0; i < frames; i++ {
			if err := conn.send(frame, nil); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		t.Fatalf("%d frames of %d bytes were all sent to a peer that reads none (err %v): the buffer never filled", frames, size, err)
	case <-time.After(300 * time.Millisecond):
	}
	fd := sockFd(t, conn)
	armed := false
	for _, events := range epollWatches(t, fd) {
		armed = armed || events&syscall.EPOLLOUT != 0
	}
	if !armed {
		t.Error("a send waits for buffer space, but nothing watches the socket for EPOLLOUT")
	}
	close(resume)
	if err := within(t, "sending once the peer reads", sent); err != nil {
		t.Fatalf("send: %v", err)
	}
	select {
	case n := <-got:
		if n != [2]int{frames, frames * size} {
			t.Errorf("the peer received %d frames, %d bytes; want %d, %d", n[0], n[1], frames, frames*size)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer never finished reading")
	}
	for _, events := range epollWatches(t, fd) {
		if events&syscall.EPOLLOUT != 0 {
			t.Errorf("after the sends, the socket is still watched for EPOLLOUT (events %#x)", events)
		}
	}
}

// Close ends a send that waits for buffer space.
func TestCloseEndsWaitingSend(t *testing.T) {
	resume := make(chan struct{})
	defer close(resume)
	c, err := Dial(stalledPeer(t, resume, 0, make(chan [2]int, 1)))
	if err != nil {
		t.Fatal(err)
	}
	conn := c.cur.Load()
	frame := make([]byte, 200_000)
	sent := make(chan error, 1)
	go func() {
		for {
			if err := conn.send(frame, nil); err != nil {
				sent <- err
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	c.Close()
	err = within(t, "a waiting send after Close", sent)
	if !errors.Is(err, os.ErrClosed) {
		t.Fatalf("send after Close: %v, want os.ErrClosed", err)
	}
}
