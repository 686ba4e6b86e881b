package zygote

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// firstReply is the name of the first reply a spawn got: "Exited" means
// the daemon deferred Spawned and the child ended within the window.
func firstReply(t *testing.T, p *Process) string {
	t.Helper()
	p.conn.mu.Lock()
	defer p.conn.mu.Unlock()
	if p.pending.first.msg == nil {
		t.Fatal("no first reply recorded")
	}
	return p.pending.first.msg.name()
}

// Run of a short child gets only Exited (no Spawned, no pidfd), yet knows
// its pid, exit code and usage.
func TestRunDefersSpawned(t *testing.T) {
	c := dial(t)

	// On a loaded machine a child may outlive the 10 ms window; one
	// deferred run out of 20 proves the flag is set (without it, none is).
	deferred := 0
	for i := 0; i < 20; i++ {
		cmd := c.Command("true")
		if err := cmd.Run(); err != nil {
			t.Fatalf("true: %v", err)
		}
		if cmd.Process.Pid <= 0 || cmd.ProcessState.Pid() != cmd.Process.Pid {
			t.Fatalf("true: Process.Pid %d, ProcessState.Pid %d", cmd.Process.Pid, cmd.ProcessState.Pid())
		}
		if cmd.ProcessState.SysUsage() == nil {
			t.Error("true: no rusage")
		}
		if firstReply(t, cmd.Process) == "Exited" {
			deferred++
		}
	}
	if deferred == 0 {
		t.Fatal("Run of true got Spawned 20 times out of 20: defer_spawned is not set")
	}
	t.Logf("%d of 20 runs of true got Exited alone", deferred)

	// The pid reported is the child's own ($$), with the exit code.
	for i := 0; ; i++ {
		cmd := c.Command("sh", "-c", "echo $$; exit 3")
		out, err := cmd.Output()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("exit 3: %v", err)
		}
		pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
		if perr != nil || pid != cmd.Process.Pid || pid != ee.Pid() || pid != cmd.ProcessState.Pid() {
			t.Fatalf("output %q; Process.Pid %d, ProcessState.Pid %d", out, cmd.Process.Pid, ee.Pid())
		}
		if firstReply(t, cmd.Process) == "Exited" {
			break
		}
		if i == 20 {
			t.Fatal("sh never ended within the window")
		}
	}

	// CombinedOutput defers too, with its pipe made here.
	cmd := c.Command("sh", "-c", "echo out; echo err >&2")
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "out\nerr\n" {
		t.Fatalf("CombinedOutput: %q %v", out, err)
	}
	if !cmd.Process.deferredSpawn() {
		t.Error("CombinedOutput did not ask for defer_spawned")
	}

	// A failed spawn is a StartError, and leaves no Process.
	cmd = c.Command("/nonexistent/program")
	if err := cmd.Run(); !errors.Is(err, syscall.ENOENT) || cmd.Process != nil {
		t.Fatalf("missing program: %v, Process %v", err, cmd.Process)
	}
}

// A child that outlives the window gets Spawned with its pidfd, then Exited.
func TestRunLongChildGetsSpawned(t *testing.T) {
	c := dial(t)
	cmd := c.Command("sh", "-c", "echo $$; sleep 0.3")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := firstReply(t, cmd.Process); got != "Spawned" {
		t.Fatalf("first reply %s, want Spawned", got)
	}
	if !cmd.Process.deferredSpawn() {
		t.Error("Run did not ask for defer_spawned")
	}
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(out))); pid != cmd.Process.Pid || pid != cmd.ProcessState.Pid() {
		t.Errorf("output %q; Process.Pid %d, ProcessState.Pid %d", out, cmd.Process.Pid, cmd.ProcessState.Pid())
	}
}

// Start does not defer: the pid and pidfd are there when it returns.
func TestStartDoesNotDefer(t *testing.T) {
	c := dial(t)
	cmd := c.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if cmd.Process.Pid <= 0 || cmd.Process.Pidfd() < 0 || cmd.Process.deferredSpawn() {
		t.Errorf("after Start: pid %d pidfd %d deferred %v", cmd.Process.Pid, cmd.Process.Pidfd(), cmd.Process.deferredSpawn())
	}
	if got := firstReply(t, cmd.Process); got != "Spawned" {
		t.Errorf("first reply %s, want Spawned", got)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// cancelOnRead cancels a context on the first read. As Stdin of a Run,
// it is read right after the request is sent, inside the window.
type cancelOnRead struct{ cancel func() }

func (r cancelOnRead) Read([]byte) (int, error) {
	r.cancel()
	return 0, io.EOF
}

// A context cancelled before the child is known kills it through the
// daemon, by spawn id.
func TestRunCancelInsideWindow(t *testing.T) {
	c := dial(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := c.CommandContext(ctx, "sleep", "30")
	cmd.Stdin = cancelOnRead{cancel}
	inWindow := false
	cmd.Cancel = func() error {
		cmd.Process.mu.RLock()
		inWindow = cmd.Process.deferred
		cmd.Process.mu.RUnlock()
		return cmd.Process.Kill()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run hangs after the context was cancelled")
	}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("got %v, want killed by SIGKILL", err)
	}
	if !inWindow {
		t.Error("Cancel ran after the child was known: the window was not tested")
	}
	if cmd.Process.Pid <= 0 || !settle(func() bool { return pidGone(cmd.Process.Pid) }) {
		t.Errorf("pid %d still there", cmd.Process.Pid)
	}
}

// A daemon lost inside the window leaves no pidfd: Run says the status
// is lost, and does not hang.
func TestDaemonKilledInsideDeferWindow(t *testing.T) {
	d := ownDaemon(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := c.Command("sleep", "0.5")
	cmd.Stdin = cancelOnRead{func() { killDaemon(t, d) }}
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run hangs after the daemon died")
	}
	var ce *ConnectionError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "is lost") {
		t.Fatalf("got %v, want a ConnectionError saying the status is lost", err)
	}
}

// Past the window, Run has the pidfd and reads the status from it when
// the daemon is lost, as Wait does after Start.
func TestDaemonKilledAfterDeferWindow(t *testing.T) {
	d := ownDaemon(t)
	reap := becomeSubreaper(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The pid comes through a file: Process.Pid is Run's until it returns.
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := c.Command("sh", "-c", "echo $$ > "+pidFile+"; sleep 0.5; exit 7")
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	time.Sleep(200 * time.Millisecond)
	killDaemon(t, d)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	reap(pid)
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run hangs after the daemon died")
	}
	if cmd.Process.Pid != pid {
		t.Errorf("Process.Pid %d, want %d", cmd.Process.Pid, pid)
	}
	var ee *ExitError
	var ce *ConnectionError
	switch {
	case exitInfoKernel(t):
		if !errors.As(runErr, &ee) || ee.ExitCode() != 7 || ee.UsageAvailable() {
			t.Fatalf("got %v, want exit status 7 from the pidfd", runErr)
		}
	case !errors.As(runErr, &ce) || strings.Contains(runErr.Error(), "is lost"):
		t.Fatalf("got %v, want the pidfd fallback's ConnectionError", runErr)
	default:
		t.Skip("SKIP part: the exit status from the pidfd needs Linux 6.15; checked the ConnectionError instead")
	}
}

// deferredSpawn reports whether the spawn asked for defer_spawned.
func (p *Process) deferredSpawn() bool { return p.pending.deferred }
