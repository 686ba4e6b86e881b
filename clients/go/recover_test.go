package zygote

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A lost daemon for the Go client: a child outlives its daemon's crash with
// its exit status intact, and a Client reconnects to a restarted daemon.

// exitInfoKernel reports whether this kernel keeps a reaped child's exit
// status for its pidfd (PIDFD_INFO_EXIT, Linux 6.15).
func exitInfoKernel(t *testing.T) bool {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	release := b.String()
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", release, err)
	}
	if major < 6 || major == 6 && minor < 15 {
		t.Logf("SKIP: kernel %s has no PIDFD_INFO_EXIT (needs 6.15): Wait on a lost daemon's child fails as before", release)
		return false
	}
	return true
}

// becomeSubreaper makes this test process the subreaper that adopts the
// children of a daemon it killed, as init would, and reaps the child pid
// once it exits: the kernel keeps the exit status for the pidfd only
// after the reaping. init here reaps only every few seconds.
func becomeSubreaper(t *testing.T) (reap func(pid int)) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		t.Fatalf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	t.Cleanup(func() { syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 0, 0) })
	return func(pid int) {
		go func() {
			var ws syscall.WaitStatus
			for {
				_, err := syscall.Wait4(pid, &ws, 0, nil)
				if err != syscall.EINTR {
					return
				}
			}
		}()
	}
}

func killDaemon(t *testing.T, d *daemon) {
	t.Helper()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = d.cmd.Process.Wait()
}

func waitWithin(t *testing.T, what string, cmd *Cmd) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: Wait hangs", what)
		return nil
	}
}

func TestDaemonKilledDuringWaitExitStatusFromPidfd(t *testing.T) {
	d := ownDaemon(t)
	reap := becomeSubreaper(t)
	fds := fdCount(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Exits with 7 when told to, after the daemon is gone.
	coded := c.Command("sh", "-c", "read x; exit 7")
	stdin, err := coded.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := coded.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(coded.Process.Pid, syscall.SIGKILL)
	// Ends by a signal sent through its pidfd.
	signaled := c.Command("sleep", "60")
	if err := signaled.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(signaled.Process.Pid, syscall.SIGKILL)

	codedErr := make(chan error, 1)
	go func() { codedErr <- coded.Wait() }() // waiting when the daemon dies
	time.Sleep(50 * time.Millisecond)
	killDaemon(t, d)
	reap(coded.Process.Pid)
	reap(signaled.Process.Pid)

	if !exitInfoKernel(t) {
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		var ce *ConnectionError
		if err := <-codedErr; !errors.As(err, &ce) {
			t.Errorf("Wait below 6.15: %v, want a ConnectionError", err)
		}
		t.Skip("SKIP part: the exit status from the pidfd needs Linux 6.15; checked the ConnectionError instead")
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	var err1 error
	select {
	case err1 = <-codedErr:
	case <-time.After(20 * time.Second):
		t.Fatal("Wait hangs after the daemon died")
	}
	var ee *ExitError
	if !errors.As(err1, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("Wait after the daemon died: %v, want exit status 7", err1)
	}
	if ee.UsageAvailable() || ee.SysUsage() != nil || ee.UserTime() != 0 {
		t.Errorf("rusage should be unavailable: %v %v", ee.UsageAvailable(), ee.SysUsage())
	}
	if coded.ProcessState.Pid() != coded.Process.Pid {
		t.Errorf("pid %d, want %d", coded.ProcessState.Pid(), coded.Process.Pid)
	}

	// Signal goes through the pidfd, without the daemon.
	if err := signaled.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal without the daemon: %v", err)
	}
	err = waitWithin(t, "signaled child", signaled)
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM || ee.String() != "signal: terminated" {
		t.Fatalf("Wait after SIGTERM: %v", err)
	}

	// Process.Wait and Cmd.Wait agree; a second Process.Wait returns the same.
	if st, err := signaled.Process.Wait(); err != nil || st != signaled.ProcessState {
		t.Errorf("Process.Wait after Cmd.Wait: %v %v", st, err)
	}
	// The pidfds, their duplicates and the pipes are closed.
	c.Close()
	if !settle(func() bool { return fdCount(t) <= fds }) {
		t.Errorf("fds: %d before, %d after", fds, fdCount(t))
	}
}

func TestReconnectAfterRestart(t *testing.T) {
	d := ownDaemon(t)
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), fdCount(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	before, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	killDaemon(t, d)

	d2, err := startDaemonIn(zygoteBin(), d.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.stop)
	// The same Client, no new Dial.
	out, err := c.Command("sh", "-c", "echo again").Output()
	if err != nil || string(out) != "again\n" {
		t.Fatalf("Command after the restart: %q %v", out, err)
	}
	after, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	if after.Pid == before.Pid || after.Pid != d2.cmd.Process.Pid {
		t.Errorf("Status is from pid %d; the old daemon was %d, the new %d", after.Pid, before.Pid, d2.cmd.Process.Pid)
	}
	// Many goroutines meeting the lost connection at once share one
	// reconnect.
	killDaemon(t, d2)
	d3, err := startDaemonIn(zygoteBin(), d.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d3.stop)
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		go func(i int) {
			out, err := c.Command("echo", strconv.Itoa(i)).Output()
			if err == nil && string(out) != strconv.Itoa(i)+"\n" {
				err = fmt.Errorf("got %q", out)
			}
			errs <- err
		}(i)
	}
	for i := 0; i < 20; i++ {
		if err := <-errs; err != nil {
			t.Errorf("after the second restart: %v", err)
		}
	}
	// One for startDaemon's readiness probe, one for the reconnect.
	if st, err := c.Status(); err != nil || st.ConnectionsAccepted != 2 {
		t.Errorf("the third daemon accepted %+v connections (%v), want 2", st, err)
	}
	// The lost connections left nothing behind.
	c.Close()
	if !settle(func() bool { return runtime.NumGoroutine() <= goroutines }) {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after Close\n%s", goroutines, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
	if !settle(func() bool { return fdCount(t) <= fds }) {
		t.Errorf("fds: %d before, %d after Close", fds, fdCount(t))
	}
}

func TestReconnectIsBounded(t *testing.T) {
	d := ownDaemon(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	killDaemon(t, d)
	began := time.Now()
	err = c.Command("true").Run()
	elapsed := time.Since(began)
	var ce *ConnectionError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "reconnecting to "+d.socket+" failed") {
		t.Fatalf("Run with no daemon: %v, want a ConnectionError about reconnecting", err)
	}
	// The Rust and Python clients' schedule: 10 attempts, 25 ms doubling
	// up to 1 s between them, about 4.6 s in all; 15 s proves it gives up
	// rather than hangs.
	if !strings.Contains(err.Error(), "failed 10 times over") {
		t.Errorf("Run with no daemon: %v, want 10 attempts", err)
	}
	if elapsed < 4*time.Second || elapsed > 15*time.Second {
		t.Errorf("giving up took %v, want about 4.6 s", elapsed)
	}
	t.Logf("gave up after %v: %v", elapsed, err)
	if _, err := c.Status(); !errors.As(err, &ce) {
		t.Errorf("Status with no daemon: %v", err)
	}
}

func TestPrivateClientDoesNotReconnect(t *testing.T) {
	if zygoteBin() == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := LaunchPrivate()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.private.Kill(); err != nil {
		t.Fatal(err)
	}
	var ce *ConnectionError
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = c.Command("true").Run()
		if errors.As(err, &ce) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.As(err, &ce) || strings.Contains(err.Error(), "reconnecting") {
		t.Errorf("Run after the private zygote died: %v", err)
	}
}

func TestProcessWaitAndRelease(t *testing.T) {
	c := dial(t)
	cmd := c.Command("sh", "-c", "exit 3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// As with os.Process, a non-zero exit is no error of Process.Wait.
	st, err := cmd.Process.Wait()
	if err != nil || st.ExitCode() != 3 || !st.UsageAvailable() || st.SysUsage() == nil {
		t.Fatalf("Process.Wait: %v %v", st, err)
	}
	if cmd.Process.Pidfd() != -1 {
		t.Error("the pidfd is still open after Process.Wait")
	}
	var ee *ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ProcessState != st {
		t.Errorf("Cmd.Wait after Process.Wait: %v", err)
	}

	cmd = c.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer syscall.Kill(pid, syscall.SIGKILL)
	if err := cmd.Process.Release(); err != nil {
		t.Fatal(err)
	}
	if cmd.Process.Pidfd() != -1 {
		t.Error("the pidfd is still open after Release")
	}
	if err := cmd.Process.Kill(); err == nil || !strings.Contains(err.Error(), "released") {
		t.Errorf("Kill after Release: %v", err)
	}
	if _, err := cmd.Process.Wait(); err == nil || !strings.Contains(err.Error(), "released") {
		t.Errorf("Wait after Release: %v", err)
	}
	if pidGone(pid) {
		t.Error("Release ended the child")
	}
	// The exit notice still arrives and is dropped; the connection goes on.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := c.Command("true").Run(); err != nil {
		t.Errorf("after a released child exited: %v", err)
	}
}
