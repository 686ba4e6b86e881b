package zygote

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// The reply path has no reader goroutine: a waiting goroutine reads the
// socket itself (see connection). These tests cover the hand-offs that
// design needs.

// waitAsync runs cmd.Wait in a goroutine and returns its result channel.
func waitAsync(cmd *Cmd) chan error {
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch
}

// readerHeld reports whether some goroutine holds conn's reader role.
func readerHeld(conn *connection) bool {
	conn.mu.Lock()
	defer conn.mu.Unlock()
	return conn.reading
}

func within(t *testing.T, what string, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s hangs", what)
		return nil
	}
}

// A reply to a goroutine that parked because another one was reading
// reaches it: the reader files it and wakes it.
func TestReplyReachesParkedGoroutine(t *testing.T) {
	c := dial(t)
	sleeper := c.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := waitAsync(sleeper)
	if !settle(func() bool { return readerHeld(sleeper.Process.conn) }) {
		t.Fatal("the goroutine in Wait never took the reader role")
	}
	status := make(chan error, 1)
	go func() { _, err := c.Status(); status <- err }()
	if err := within(t, "Status while another goroutine reads", status); err != nil {
		t.Fatalf("Status: %v", err)
	}
	if err := c.Command("true").Run(); err != nil {
		t.Fatalf("Run while another goroutine reads: %v", err)
	}
	if err := sleeper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var ee *ExitError
	if err := within(t, "Wait after Kill", waited); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait after Kill: %v, want signal: killed", err)
	}
}

// When the reader's own reply arrives, a parked goroutine takes over the
// reading: the later exit of its child reaches it.
func TestReaderRoleIsHandedOver(t *testing.T) {
	c := dial(t)
	short := c.Command("sleep", "0.3")
	long := c.Command("sleep", "60")
	for _, cmd := range []*Cmd{short, long} {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	shortDone := waitAsync(short)
	conn := short.Process.conn
	if !settle(func() bool { return readerHeld(conn) }) {
		t.Fatal("the goroutine in Wait never took the reader role")
	}
	longDone := waitAsync(long)
	if !settle(func() bool {
		conn.mu.Lock()
		defer conn.mu.Unlock()
		return len(conn.waiters) == 1
	}) {
		t.Fatal("the second Wait never parked behind the reader")
	}
	if err := within(t, "Wait of the short child", shortDone); err != nil {
		t.Fatalf("short child: %v", err)
	}
	if !settle(func() bool { return readerHeld(conn) }) {
		t.Fatal("nobody took over the reader role after the reader's reply")
	}
	if err := long.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var ee *ExitError
	if err := within(t, "Wait of the long child", longDone); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("long child: %v, want signal: terminated", err)
	}
}

// The exit of a child nobody waits for is read by the sweep, so the
// daemon is not left holding it; Wait then returns it at once.
func TestSweepReadsUnwaitedExit(t *testing.T) {
	c := dial(t)
	cmd := c.Command("sh", "-c", "exit 7")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := cmd.Process
	if !settle(func() bool {
		p.conn.mu.Lock()
		defer p.conn.mu.Unlock()
		return p.pending.exit != nil && !p.conn.reading
	}) {
		t.Fatal("the exit notice of a child nobody waits for was never read")
	}
	var ee *ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("Wait: %v, want exit status 7", err)
	}
}

// Many children started before any is waited for: their notices queue
// up and are filed by later Starts and the sweep; every Wait gets its own.
func TestManyUnwaitedChildren(t *testing.T) {
	c := dial(t)
	const n = 150
	cmds := make([]*Cmd, n)
	for i := range cmds {
		cmds[i] = c.Command("sh", "-c", "exit $0", string(rune('0'+i%10)))
		if err := cmds[i].Start(); err != nil {
			t.Fatalf("Start %d: %v", i, err)
		}
	}
	for i := n - 1; i >= 0; i-- {
		err := cmds[i].Wait()
		if code := cmds[i].ProcessState.ExitCode(); code != i%10 {
			t.Fatalf("child %d: exit code %d (%v), want %d", i, code, err, i%10)
		}
	}
}

// Close with nobody reading finishes the connection itself: a later Wait
// and Command fail with ErrClosed at once.
func TestCloseWithoutReader(t *testing.T) {
	c := dial(t)
	cmd := c.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	if err := within(t, "Close", closed); err != nil {
		t.Fatal(err)
	}
	if err := within(t, "Wait after Close", waitAsync(cmd)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close: %v, want ErrClosed", err)
	}
}

// The child gets this process's environment as it is at Start: a change
// between spawns is seen (envVars caches the last one).
func TestEnvironmentChangesBetweenSpawns(t *testing.T) {
	c := dial(t)
	echo := func() string {
		out, err := c.Command("sh", "-c", `printf %s "${ZYGOTE_GO_ENVTEST-unset}"`).Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	t.Setenv("ZYGOTE_GO_ENVTEST", "one")
	if got := echo(); got != "one" {
		t.Fatalf("got %q, want one", got)
	}
	if got := echo(); got != "one" {
		t.Fatalf("again: got %q, want one", got)
	}
	os.Setenv("ZYGOTE_GO_ENVTEST", "two")
	if got := echo(); got != "two" {
		t.Fatalf("after Setenv: got %q, want two", got)
	}
	os.Unsetenv("ZYGOTE_GO_ENVTEST")
	if got := echo(); got != "unset" {
		t.Fatalf("after Unsetenv: got %q, want unset", got)
	}
}
