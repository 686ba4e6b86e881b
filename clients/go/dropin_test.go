package zygote

// Code moved over from os/exec by changing the import keeps its meaning:
// a nil Cancel, Cmd literals and the package-level Command, os/exec's
// error texts, and options that are refused before anything is sent.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNilCancelIsOsExecs(t *testing.T) {
	c := dial(t)

	t.Run("without WaitDelay the context does not touch the child", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := c.CommandContext(ctx, "sh", "-c", "sleep 0.3; exit 7")
		cmd.Cancel = nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cancel()
		err := cmd.Wait()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("Wait: %v, want the child's own exit 7 (nil Cancel interrupts nothing)", err)
		}
	})

	t.Run("with WaitDelay the child is killed once it has passed", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := c.CommandContext(ctx, "sleep", "30")
		cmd.Cancel = nil
		cmd.WaitDelay = 200 * time.Millisecond
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		cancel()
		err := cmd.Wait()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("Wait: %v, want SIGKILL after WaitDelay", err)
		}
		if errors.Is(err, context.Canceled) {
			t.Errorf("Wait: %v: with a nil Cancel the context's error is not reported", err)
		}
		if elapsed := time.Since(began); elapsed < 150*time.Millisecond || elapsed > 10*time.Second {
			t.Errorf("Wait returned after %v, want about WaitDelay (200ms)", elapsed)
		}
	})

	t.Run("Run with a context done mid-way", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		cmd := c.CommandContext(ctx, "sh", "-c", "sleep 0.3")
		cmd.Cancel = nil
		if err := cmd.Run(); err != nil {
			t.Fatalf("Run: %v, want the child to finish on its own", err)
		}
	})
}

func TestCmdLiteralAndPackageCommandUseTheDefaultClient(t *testing.T) {
	if sharedSocket == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	if err := (&Cmd{Path: "/bin/true"}).Run(); err != nil {
		t.Fatalf("a Cmd literal: %v", err)
	}
	out, err := Command("sh", "-c", "echo $PPID").Output()
	if err != nil {
		t.Fatalf("Command: %v", err)
	}
	if strings.TrimSpace(string(out)) == strings.TrimSpace(itoa(os.Getpid())) {
		t.Errorf("the child's parent is this process, not the zygote")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = CommandContext(ctx, "sleep", "30").Run()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("CommandContext: %v, want killed by the context", err)
	}
	first, err := DefaultClient()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := DefaultClient(); again != first {
		t.Errorf("DefaultClient dialled again while connected")
	}
	if first.path != sharedSocket {
		t.Errorf("DefaultClient dialled %q, want $%s = %q", first.path, SocketEnv, sharedSocket)
	}
}

func TestDefaultClientDialsAgainAfterAFailure(t *testing.T) {
	if sharedSocket == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	defaultClient.mu.Lock()
	saved := defaultClient.client
	defaultClient.client = nil
	defaultClient.mu.Unlock()
	t.Cleanup(func() {
		defaultClient.mu.Lock()
		if defaultClient.client != nil && defaultClient.client != saved {
			defaultClient.client.Close()
		}
		defaultClient.client = saved
		defaultClient.mu.Unlock()
	})
	missing := t.TempDir() + "/none.sock"
	t.Setenv(SocketEnv, missing)
	err := Command("true").Run()
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run with no daemon at $%s: %v, want an error naming %s", SocketEnv, err, missing)
	}
	t.Setenv(SocketEnv, sharedSocket)
	if err := Command("true").Run(); err != nil {
		t.Fatalf("Run once the daemon is there: %v", err)
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestErrorTextsAreOsExecs does the same wrong thing to an os/exec Cmd
// and to a zygote Cmd, and wants the same error text.
func TestErrorTextsAreOsExecs(t *testing.T) {
	c := dial(t)
	errText := func(err error) string {
		if err == nil {
			return "<nil>"
		}
		return err.Error()
	}
	type pair struct {
		theirs func() error
		ours   func() error
	}
	started := func() (*exec.Cmd, *Cmd) {
		e := exec.Command("true")
		z := c.Command("true")
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		if err := z.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Wait(); z.Wait() })
		return e, z
	}
	cases := map[string]pair{
		"Start twice": {
			func() error { e, _ := started(); return e.Start() },
			func() error { _, z := started(); return z.Start() },
		},
		"no command": {
			func() error { return (&exec.Cmd{}).Start() },
			func() error { return (&Cmd{}).Start() },
		},
		"Wait before Start": {
			func() error { return exec.Command("true").Wait() },
			func() error { return c.Command("true").Wait() },
		},
		"Wait twice": {
			func() error { e, _ := started(); e.Wait(); return e.Wait() },
			func() error { _, z := started(); z.Wait(); return z.Wait() },
		},
		"StdoutPipe with Stdout set": {
			func() error { e := exec.Command("true"); e.Stdout = io.Discard; _, err := e.StdoutPipe(); return err },
			func() error { z := c.Command("true"); z.Stdout = io.Discard; _, err := z.StdoutPipe(); return err },
		},
		"StderrPipe with Stderr set": {
			func() error { e := exec.Command("true"); e.Stderr = io.Discard; _, err := e.StderrPipe(); return err },
			func() error { z := c.Command("true"); z.Stderr = io.Discard; _, err := z.StderrPipe(); return err },
		},
		"StdinPipe with Stdin set": {
			func() error { e := exec.Command("true"); e.Stdin = os.Stdin; _, err := e.StdinPipe(); return err },
			func() error { z := c.Command("true"); z.Stdin = os.Stdin; _, err := z.StdinPipe(); return err },
		},
		"StdoutPipe after Start": {
			func() error { e, _ := started(); _, err := e.StdoutPipe(); return err },
			func() error { _, z := started(); _, err := z.StdoutPipe(); return err },
		},
		"StderrPipe after Start": {
			func() error { e, _ := started(); _, err := e.StderrPipe(); return err },
			func() error { _, z := started(); _, err := z.StderrPipe(); return err },
		},
		"StdinPipe after Start": {
			func() error { e, _ := started(); _, err := e.StdinPipe(); return err },
			func() error { _, z := started(); _, err := z.StdinPipe(); return err },
		},
		"Output with Stdout set": {
			func() error { e := exec.Command("true"); e.Stdout = io.Discard; _, err := e.Output(); return err },
			func() error { z := c.Command("true"); z.Stdout = io.Discard; _, err := z.Output(); return err },
		},
		"CombinedOutput with Stderr set": {
			func() error {
				e := exec.Command("true")
				e.Stderr = io.Discard
				_, err := e.CombinedOutput()
				return err
			},
			func() error { z := c.Command("true"); z.Stderr = io.Discard; _, err := z.CombinedOutput(); return err },
		},
		"Cancel without a context": {
			func() error { e := exec.Command("true"); e.Cancel = func() error { return nil }; return e.Run() },
			func() error { z := c.Command("true"); z.Cancel = func() error { return nil }; return z.Run() },
		},
		"environment with NUL": {
			func() error { e := exec.Command("true"); e.Env = []string{"A=\x00"}; return e.Run() },
			func() error { z := c.Command("true"); z.Env = []string{"A=\x00"}; return z.Run() },
		},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			theirs, ours := errText(p.theirs()), errText(p.ours())
			if theirs == "<nil>" || ours != theirs {
				t.Errorf("zygote says %q, os/exec says %q", ours, theirs)
			}
		})
	}
	// os.Process's own texts, for zygote's Process.
	p, z := started()
	_ = p
	if err := z.Process.Signal(customSignal{}); err == nil || err.Error() != "os: unsupported signal type" {
		t.Errorf("Signal(custom): %v", err)
	}
}

type customSignal struct{}

func (customSignal) String() string { return "custom" }
func (customSignal) Signal()        {}

// spawnOptions are the values a fuzzer turns, each at the edge of some
// wire type.
type spawnOptions struct {
	resource   int
	cur, max   uint64
	pgid       int
	signal     int
	graceMilli int64
	umask      uint32
	memoryMax  uint64
	cpuWeight  uint32
}

func (s spawnOptions) cmd(c *Client) *Cmd {
	cmd := c.Command("/bin/true")
	cmd.Zygote = Options{
		Rlimits:      []Rlimit{{Resource: s.resource, Cur: s.cur, Max: s.max}},
		Setpgid:      true,
		Pgid:         s.pgid,
		KillOnClose:  syscall.Signal(s.signal),
		Timeout:      time.Minute,
		TimeoutGrace: time.Duration(s.graceMilli) * time.Millisecond,
		Umask:        &s.umask,
		Cgroup:       &CgroupOptions{MemoryMax: s.memoryMax, CPUWeight: s.cpuWeight},
	}
	return cmd
}

// checkEncoded builds and encodes s; a refusal must be EINVAL, and a
// frame must decode (as the daemon decodes it) to exactly the values
// asked for: nothing wraps into another meaning.
func checkEncoded(t *testing.T, s spawnOptions) (refused bool) {
	t.Helper()
	p, err := s.cmd(&Client{}).build(false)
	if err != nil {
		if !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("%+v: refused with %v, want EINVAL", s, err)
		}
		return true
	}
	frame, err := encodeClient(&clientMessage{Spawn: p.req})
	if err != nil {
		t.Fatalf("%+v: encoding: %v", s, err)
	}
	m, err := decodeClient(frame)
	if err != nil {
		t.Fatalf("%+v: the daemon would reject the frame: %v", s, err)
	}
	r := m.Spawn
	if int(*r.ProcessGroup) != s.pgid {
		t.Errorf("%+v: process group %d on the wire", s, *r.ProcessGroup)
	}
	if s.signal != 0 && int(r.KillOnClose.Signal) != s.signal {
		t.Errorf("%+v: kill-on-close signal %d on the wire", s, r.KillOnClose.Signal)
	}
	if want := max(s.graceMilli, 0); s.graceMilli != 0 && int64(r.Timeout.GraceMillis) != want {
		t.Errorf("%+v: grace %d ms on the wire", s, r.Timeout.GraceMillis)
	}
	if *r.Umask != s.umask&0o777 {
		t.Errorf("%+v: umask %o on the wire", s, *r.Umask)
	}
	found := false
	for _, l := range r.Rlimits {
		if int(l.Resource) == s.resource {
			found = l.Soft == s.cur && l.Hard == s.max
		}
	}
	if !found {
		t.Errorf("%+v: resource %d is not on the wire as asked: %+v", s, s.resource, r.Rlimits)
	}
	return false
}

var edgeOptions = []spawnOptions{
	{resource: 7, cur: 64, max: 64, pgid: 0, signal: 9, graceMilli: 10, umask: 0o22},
	{resource: -1, cur: 1, max: 1},
	{resource: 1 << 32, cur: 1, max: 1},
	{resource: 16, cur: 1, max: 1},
	{resource: 7, cur: 2, max: 1},
	{resource: 7, cur: math.MaxUint64, max: math.MaxUint64, memoryMax: math.MaxUint64, cpuWeight: math.MaxUint32},
	{resource: 7, pgid: -1},
	{resource: 7, pgid: 1<<32 + 5},
	{resource: 7, pgid: math.MaxInt32},
	{resource: 7, signal: -1},
	{resource: 7, signal: 65},
	{resource: 7, signal: 1<<32 + 9},
	{resource: 7, graceMilli: -1},
	{resource: 7, graceMilli: math.MinInt64 / int64(time.Millisecond)},
	{resource: 7, umask: math.MaxUint32},
}

func FuzzSpawnOptionsEncoding(f *testing.F) {
	for _, s := range edgeOptions {
		f.Add(s.resource, s.cur, s.max, s.pgid, s.signal, s.graceMilli, s.umask, s.memoryMax, s.cpuWeight)
	}
	f.Fuzz(func(t *testing.T, resource int, cur, max uint64, pgid, signal int, grace int64, umask uint32, memoryMax uint64, cpuWeight uint32) {
		if grace > math.MaxInt64/int64(time.Millisecond) || grace < math.MinInt64/int64(time.Millisecond) {
			t.Skip("a Duration cannot hold it")
		}
		checkEncoded(t, spawnOptions{resource, cur, max, pgid, signal, grace, umask, memoryMax, cpuWeight})
	})
}

// TestOutOfRangeOptionsNeverReachTheDaemon sends the edge values through
// the real daemon: each is refused with EINVAL before sending, or the
// daemon answers it; the connection and a child in flight on it never
// notice.
func TestOutOfRangeOptionsNeverReachTheDaemon(t *testing.T) {
	c := dial(t)
	conn := c.cur.Load()
	inFlight := c.Command("sleep", "60")
	if err := inFlight.Start(); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, s := range edgeOptions {
		wantRefused := checkEncoded(t, s)
		err := s.cmd(c).Run()
		var se *StartError
		switch {
		case wantRefused && !errors.Is(err, syscall.EINVAL):
			t.Errorf("%+v: Run %v, want EINVAL", s, err)
		case wantRefused && errors.As(err, &se):
			t.Errorf("%+v: the daemon saw it (%v): it was not refused before sending", s, err)
		case wantRefused:
			refused++
		}
		var ce *ConnectionError
		if errors.As(err, &ce) || c.cur.Load() != conn {
			t.Fatalf("%+v: the connection was lost: %v", s, err)
		}
	}
	if refused == 0 {
		t.Error("no value was refused: the table tests nothing")
	}
	if err := inFlight.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the child in flight: %v", err)
	}
	inFlight.Process.Kill()
	err := inFlight.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the child in flight ended with %v, want our SIGKILL", err)
	}
	var out bytes.Buffer
	ok := c.Command("echo", "still fine")
	ok.Stdout = &out
	if err := ok.Run(); err != nil || out.String() != "still fine\n" {
		t.Errorf("after the edge values: %v %q", err, out.String())
	}
}
