package zygote

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestExitCodesAndSignals(t *testing.T) {
	c := dial(t)

	if err := c.Command("true").Run(); err != nil {
		t.Fatalf("true: %v", err)
	}

	cmd := c.Command("sh", "-c", "exit 3")
	err := cmd.Run()
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("exit 3: got %v, want *ExitError", err)
	}
	if ee.ExitCode() != 3 || !ee.Exited() || ee.Success() || ee.String() != "exit status 3" {
		t.Errorf("exit 3: code %d exited %v success %v %q", ee.ExitCode(), ee.Exited(), ee.Success(), ee.String())
	}
	if cmd.ProcessState != ee.ProcessState {
		t.Error("Cmd.ProcessState is not the ExitError's")
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.ExitStatus() != 3 {
		t.Errorf("wait status %v", ws)
	}

	cmd = c.Command("sh", "-c", "kill -TERM $$")
	err = cmd.Run()
	if !errors.As(err, &ee) {
		t.Fatalf("kill -TERM: got %v", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if ee.ExitCode() != -1 || ee.Exited() || !ws.Signaled() || ws.Signal() != syscall.SIGTERM || ee.String() != "signal: terminated" {
		t.Errorf("kill -TERM: code %d exited %v status %v %q", ee.ExitCode(), ee.Exited(), ws, ee.String())
	}

	// CPU time and peak RSS arrive with the exit.
	cmd = c.Command("sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru.Maxrss <= 0 || cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime() <= 0 {
		t.Errorf("rusage: maxrss %d user %v system %v", ru.Maxrss, cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime())
	}
	if cmd.ProcessState.Pid() != cmd.Process.Pid || cmd.Process.Pid <= 0 {
		t.Errorf("pid %d vs %d", cmd.ProcessState.Pid(), cmd.Process.Pid)
	}
}

func TestSignalKillAndPidfd(t *testing.T) {
	c := dial(t)
	cmd := c.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd := cmd.Process.Pidfd()
	var st syscall.Stat_t
	if err := syscall.Fstat(pidfd, &st); err != nil {
		t.Fatalf("pidfd %d: %v", pidfd, err)
	}
	if flags, err := fcntlGetfd(pidfd); err != nil || flags&syscall.FD_CLOEXEC == 0 {
		t.Errorf("pidfd is not close-on-exec: %v %v", flags, err)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("signal 0 to a live child: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("after Kill: %v", err)
	}
	if cmd.Process.Pidfd() != -1 {
		t.Error("pidfd still open after Wait")
	}
	if err := cmd.Process.Kill(); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Kill after Wait: %v", err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("second Wait succeeded")
	}
}

func fcntlGetfd(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

func TestStdio(t *testing.T) {
	c := dial(t)
	dir := t.TempDir()

	t.Run("files", func(t *testing.T) {
		in := filepath.Join(dir, "in")
		if err := os.WriteFile(in, []byte("from a file\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fin, _ := os.Open(in)
		defer fin.Close()
		fout, _ := os.Create(filepath.Join(dir, "out"))
		defer fout.Close()
		ferr, _ := os.Create(filepath.Join(dir, "err"))
		defer ferr.Close()
		cmd := c.Command("sh", "-c", "cat; echo oops >&2")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = fin, fout, ferr
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		if out, _ := os.ReadFile(filepath.Join(dir, "out")); string(out) != "from a file\n" {
			t.Errorf("stdout file: %q", out)
		}
		if out, _ := os.ReadFile(filepath.Join(dir, "err")); string(out) != "oops\n" {
			t.Errorf("stderr file: %q", out)
		}
	})

	t.Run("nil is /dev/null", func(t *testing.T) {
		out, err := c.Command("sh", "-c", "cat; readlink /proc/self/fd/0").Output()
		if err != nil || string(out) != "/dev/null\n" {
			t.Errorf("%q %v", out, err)
		}
	})

	t.Run("pipes", func(t *testing.T) {
		cmd := c.Command("sh", "-c", "read line; echo got $line; echo warn >&2")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, _ := cmd.StdoutPipe()
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(stdin, "hello\n"); err != nil {
			t.Fatal(err)
		}
		stdin.Close()
		out, _ := io.ReadAll(stdout)
		errOut, _ := io.ReadAll(stderr)
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if string(out) != "got hello\n" || string(errOut) != "warn\n" {
			t.Errorf("stdout %q stderr %q", out, errOut)
		}
	})

	t.Run("readers and writers", func(t *testing.T) {
		var out, errOut bytes.Buffer
		cmd := c.Command("sh", "-c", "tr a-z A-Z; echo done >&2")
		cmd.Stdin = strings.NewReader("shout\n")
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		if out.String() != "SHOUT\n" || errOut.String() != "done\n" {
			t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
		}
	})

	t.Run("combined output", func(t *testing.T) {
		out, err := c.Command("sh", "-c", "echo 1; echo 2 >&2; echo 3").CombinedOutput()
		if err != nil || string(out) != "1\n2\n3\n" {
			t.Errorf("%q %v", out, err)
		}
	})

	t.Run("output fills ExitError.Stderr", func(t *testing.T) {
		out, err := c.Command("sh", "-c", "echo partial; echo why >&2; exit 2").Output()
		var ee *ExitError
		if !errors.As(err, &ee) || string(ee.Stderr) != "why\n" || string(out) != "partial\n" {
			t.Errorf("out %q err %v", out, err)
		}
	})

	t.Run("10 MiB through cat", func(t *testing.T) {
		data := make([]byte, 10<<20)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd := c.Command("cat")
		cmd.Stdin = bytes.NewReader(data)
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Errorf("cat returned %d bytes, not the 10 MiB sent", out.Len())
		}
	})
}

func TestExtraFilesEnvDirArgs(t *testing.T) {
	c := dial(t)

	t.Run("extra files and nothing else", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// An inheritable fd of this process must not reach the child.
		leak, err := syscall.Dup(int(os.Stdin.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(leak)
		cmd := c.Command("sh", "-c", "echo via-fd3 >&3; ls /proc/$$/fd")
		cmd.ExtraFiles = []*os.File{w}
		out, err := cmd.Output()
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		fds := strings.Fields(string(out))
		sort.Strings(fds)
		if strings.Join(fds, " ") != "0 1 2 3" {
			t.Errorf("the child's fds are %v, want 0 1 2 3", fds)
		}
		got, _ := io.ReadAll(r)
		if string(got) != "via-fd3\n" {
			t.Errorf("fd 3 carried %q", got)
		}
	})

	t.Run("env", func(t *testing.T) {
		cmd := c.Command("env")
		cmd.Env = []string{"A=1", "B=x=y", "A=2", "EMPTY="}
		out, err := cmd.Output()
		if err != nil || string(out) != "B=x=y\nA=2\nEMPTY=\n" {
			t.Errorf("%q %v", out, err)
		}
		if env := cmd.Environ(); strings.Join(env, ",") != "B=x=y,A=2,EMPTY=" {
			t.Errorf("Environ() = %q", env)
		}

		t.Setenv("ZYGOTE_GO_TEST_VAR", "inherited")
		out, err = c.Command("sh", "-c", "echo $ZYGOTE_GO_TEST_VAR").Output()
		if err != nil || string(out) != "inherited\n" {
			t.Errorf("nil Env: %q %v", out, err)
		}

		// Odd entries are kept as os/exec keeps them (a leading "=" is
		// part of the key), except one without "=", which is left out.
		cmd = c.Command("/usr/bin/env")
		cmd.Env = []string{"NOEQUALS", "=A=B", "=", "=A=C", "K=v"}
		out, err = cmd.Output()
		if err != nil || string(out) != "=\n=A=C\nK=v\n" {
			t.Errorf("odd entries: %q %v", out, err)
		}

		cmd = c.Command("true")
		cmd.Env = []string{"A=x\x00y"}
		if err := cmd.Run(); err == nil || !strings.Contains(err.Error(), "NUL") {
			t.Errorf("NUL in env: %v", err)
		}
	})

	t.Run("dir", func(t *testing.T) {
		dir := t.TempDir()
		cmd := c.Command("sh", "-c", "pwd; echo $PWD")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil || string(out) != dir+"\n"+dir+"\n" {
			t.Errorf("%q %v", out, err)
		}
		wd, _ := os.Getwd()
		out, err = c.Command("pwd").Output()
		if err != nil || string(out) != wd+"\n" {
			t.Errorf("default dir: %q %v, want %q", out, err, wd)
		}
	})

	t.Run("non-UTF-8 and empty args", func(t *testing.T) {
		arg := "\xff\xfe-not-utf8"
		out, err := c.Command("sh", "-c", `printf '%s|%s|%s' "$0" "$1" "$2"`, "zero", arg, "").Output()
		if err != nil || string(out) != "zero|"+arg+"|" {
			t.Errorf("%q %v", out, err)
		}
		cmd := c.Command("sh", "-c", `tr '\0' ' ' </proc/$$/cmdline`)
		cmd.Args[0] = "custom-argv0"
		out, err = cmd.Output()
		if err != nil || !strings.HasPrefix(string(out), "custom-argv0 -c ") {
			t.Errorf("argv0: %q %v", out, err)
		}
	})

	t.Run("umask and rlimits are transparent", func(t *testing.T) {
		old := syscall.Umask(0o027)
		defer syscall.Umask(old)
		c2, err := Dial(sharedSocket)
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		out, err := c2.Command("sh", "-c", "umask; ulimit -s").Output()
		if err != nil {
			t.Fatal(err)
		}
		var st syscall.Rlimit
		_ = syscall.Getrlimit(syscall.RLIMIT_STACK, &st)
		want := "0027\n" + strconv.FormatUint(st.Cur/1024, 10) + "\n"
		if st.Cur == ^uint64(0) {
			want = "0027\nunlimited\n"
		}
		if string(out) != want {
			t.Errorf("got %q, want %q", out, want)
		}
		mask := uint32(0o002)
		cmd := c2.Command("sh", "-c", "umask; ulimit -n")
		cmd.Zygote.Umask = &mask
		cmd.Zygote.Rlimits = []Rlimit{{Resource: syscall.RLIMIT_NOFILE, Cur: 77, Max: 77}}
		out, err = cmd.Output()
		if err != nil || string(out) != "0002\n77\n" {
			t.Errorf("options: %q %v", out, err)
		}
	})
}

func TestStartErrors(t *testing.T) {
	c := dial(t)

	// Command looks the name up in this process's PATH, as os/exec does.
	cmd := c.Command("zygote-go-no-such-program")
	var se *StartError
	if !errors.As(cmd.Err, &se) || !errors.Is(cmd.Err, syscall.ENOENT) || !errors.Is(cmd.Err, exec.ErrNotFound) || se.Stage != "LookPath" {
		t.Errorf("Cmd.Err of a missing program: %v", cmd.Err)
	}
	if err := cmd.Run(); err != cmd.Err {
		t.Errorf("Run with Cmd.Err set: %v, want %v", err, cmd.Err)
	}
	if !strings.Contains(cmd.Err.Error(), "zygote-go-no-such-program") {
		t.Errorf("the error does not name the program: %v", cmd.Err)
	}
	if cmd := c.Command("sh"); cmd.Err != nil || !filepath.IsAbs(cmd.Path) {
		t.Errorf("Command(\"sh\"): Path %q Err %v, want an absolute path", cmd.Path, cmd.Err)
	}
	// A bare name set as Path is looked up by the zygote, in the child's
	// environment's PATH.
	cmd = c.Command("true")
	cmd.Path = "zygote-go-no-such-program"
	err := cmd.Run()
	if !errors.As(err, &se) || !errors.Is(err, syscall.ENOENT) || !errors.Is(err, exec.ErrNotFound) || se.Stage != "Exec" {
		t.Errorf("missing program: %v", err)
	}

	err = c.Command("/nonexistent/program").Run()
	if !errors.Is(err, syscall.ENOENT) || errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing path: %v", err)
	}

	script := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = c.Command(script).Run()
	if !errors.Is(err, syscall.EACCES) {
		t.Errorf("non-executable: %v", err)
	}

	cmd = c.Command("true")
	cmd.Dir = "/nonexistent/dir"
	if err := cmd.Run(); !errors.As(err, &se) || se.Stage != "Chdir" || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("bad Dir: %v", err)
	}

	if err := c.Command("true", "a\x00b").Run(); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("NUL in an argument: %v", err)
	}

	// The connection carries on.
	if err := c.Command("true").Run(); err != nil {
		t.Errorf("after the failures: %v", err)
	}
}

func TestContextCancel(t *testing.T) {
	c := dial(t)

	t.Run("kills the child", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		cmd := c.CommandContext(ctx, "sleep", "30")
		start := time.Now()
		err := cmd.Run()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("got %v, want killed", err)
		}
		if elapsed := time.Since(start); elapsed > 10*time.Second {
			t.Errorf("cancel took %v", elapsed)
		}
	})

	t.Run("already done", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.CommandContext(ctx, "true").Start(); !errors.Is(err, context.Canceled) {
			t.Errorf("Start with a done context: %v", err)
		}
	})

	t.Run("Cancel then WaitDelay kills", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cmd := c.CommandContext(ctx, "sh", "-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 300 * time.Millisecond
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 6)
		if _, err := io.ReadFull(stdout, line); err != nil {
			t.Fatal(err)
		}
		cancel()
		err := cmd.Wait()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("got %v, want SIGKILL after the ignored SIGTERM", err)
		}
	})

	t.Run("WaitDelay bounds I/O after exit", func(t *testing.T) {
		var out bytes.Buffer
		// A grandchild keeps the stdout pipe open after its parent exits.
		cmd := c.Command("sh", "-c", "sleep 5 & echo parent-done")
		cmd.Stdout = &out
		cmd.WaitDelay = 200 * time.Millisecond
		start := time.Now()
		err := cmd.Run()
		if !errors.Is(err, ErrWaitDelay) {
			t.Errorf("got %v, want ErrWaitDelay", err)
		}
		if elapsed := time.Since(start); elapsed > 4*time.Second {
			t.Errorf("Wait took %v: WaitDelay did not cut the I/O", elapsed)
		}
		if !strings.Contains(out.String(), "parent-done") {
			t.Errorf("output %q", out.String())
		}
	})
}

// fdCount is the number of fds this process has open.
func fdCount(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// settle waits (up to 10 s) for f to hold, as goroutines wind down.
func settle(f func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func pidGone(pid int) bool {
	// The daemon reaps its children: kill(pid, 0) fails once it has.
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func TestCloseKillsAndLeaksNothing(t *testing.T) {
	if sharedSocket == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), fdCount(t)

	c, err := Dial(sharedSocket)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*Cmd
	for i := 0; i < 3; i++ {
		cmd := c.Command("sleep", "60")
		cmd.Zygote.KillOnClose = syscall.SIGKILL
		var out bytes.Buffer
		cmd.Stdout = &out // a bridging goroutine and a pipe to clean up
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	survivor := c.Command("sleep", "60")
	if err := survivor.Start(); err != nil {
		t.Fatal(err)
	}
	survivorPid := survivor.Process.Pid
	defer syscall.Kill(survivorPid, syscall.SIGKILL)

	errs := make(chan error, len(cmds))
	for _, cmd := range cmds {
		go func(cmd *Cmd) { errs <- cmd.Wait() }(cmd)
	}
	time.Sleep(50 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range cmds {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Wait after Close: %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Wait hangs after Close")
		}
	}
	if err := survivor.Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("survivor's Wait: %v", err)
	}
	for _, cmd := range cmds {
		if !settle(func() bool { return pidGone(cmd.Process.Pid) }) {
			t.Errorf("kill-on-close child %d still runs after Close", cmd.Process.Pid)
		}
	}
	if pidGone(survivorPid) {
		t.Errorf("the child without kill-on-close died with the connection")
	}
	if err := c.Command("true").Run(); !errors.Is(err, ErrClosed) {
		t.Errorf("Command after Close: %v", err)
	}
	if !settle(func() bool { return runtime.NumGoroutine() <= goroutines }) {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after Close\n%s", goroutines, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
	if !settle(func() bool { return fdCount(t) <= fds }) {
		t.Errorf("fds: %d before, %d after Close", fds, fdCount(t))
	}
}

func TestConcurrentGoroutines(t *testing.T) {
	c := dial(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			// Each child outlives the others' starts: a lock held across
			// a round trip or a wait would serialize them.
			want := strconv.Itoa(i)
			out, err := c.Command("sh", "-c", "sleep 1; echo "+want).Output()
			if err != nil {
				errs <- err
			} else if strings.TrimSpace(string(out)) != want {
				errs <- errors.New("goroutine " + want + " got " + string(out))
			}
		}(i)
	}
	began := time.Now()
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// 200 one-second children serialized would take 200 s.
	if elapsed := time.Since(began); elapsed > 60*time.Second {
		t.Errorf("%d concurrent 1-second children took %v", n, elapsed)
	}
	st, err := c.Status()
	if err != nil || st.ConnectionsOpen < 1 {
		t.Errorf("status %+v %v", st, err)
	}
}

func TestLaunchPrivate(t *testing.T) {
	if zygoteBin() == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := LaunchPrivate()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Command("echo", "private").Output()
	if err != nil || string(out) != "private\n" {
		t.Errorf("%q %v", out, err)
	}
	st, err := c.Status()
	if err != nil || st.ConnectionsOpen != 1 {
		t.Errorf("status %+v %v", st, err)
	}
	pid := c.private.Pid
	c.Close()
	if !settle(func() bool { return pidGone(pid) }) {
		t.Errorf("the private zygote %d did not exit after Close", pid)
	}
}

// A Cmd that fails to build after making the pipe stdout and stderr
// share (a closed file in ExtraFiles) leaves no fd behind.
func TestBuildFailureClosesSharedOutputPipe(t *testing.T) {
	c := dial(t)
	closed, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	before := fdCount(t)
	for range 5 {
		cmd := c.Command("true")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.ExtraFiles = []*os.File{closed}
		if err := cmd.Run(); err == nil || !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Run with a closed ExtraFile: %v", err)
		}
	}
	if after := fdCount(t); after != before {
		t.Errorf("fds: %d before, %d after five failed builds", before, after)
	}
}

// envHelperSocket, when set, makes the test binary an envHelper run
// against the zygote at that socket.
const envHelperSocket = "ZYGOTE_GO_TEST_ENV_HELPER"

// envHelper starts `cat /proc/self/environ` with os/exec and through the
// zygote at socket, first with nil Env and then with
// append(os.Environ(), "ADDED=1"), and prints each child's environment as
// an "exec %q" or "zygote %q" line.
func envHelper(socket string) int {
	c, err := Dial(socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	for _, env := range [][]string{nil, append(os.Environ(), "ADDED=1")} {
		native := exec.Command("/bin/cat", "/proc/self/environ")
		native.Env = env
		out, err := native.Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "os/exec with Env %q: %v\n", env, err)
			return 1
		}
		fmt.Printf("exec %q\n", out)
		cmd := c.Command("/bin/cat", "/proc/self/environ")
		cmd.Env = env
		if out, err = cmd.Output(); err != nil {
			fmt.Fprintf(os.Stderr, "zygote with Env %q: %v\n", env, err)
			return 1
		}
		fmt.Printf("zygote %q\n", out)
	}
	return 0
}

// A program whose environment holds entries that are no plain NAME=VALUE
// ("=A=B", left by some shells and Windows-ported tools, and "NOEQ")
// still spawns, and its children get what os/exec would give them, byte
// for byte, but for the entry without "=", which names no variable.
func TestInheritedOddEnvironment(t *testing.T) {
	dial(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// os/exec passes these on raw, "NOEQ" included. Go's own
	// os.Environ keeps the first of the entries that share a name up to
	// their first "=" ("=A=B", "==x" and "="), so "==x" and "=" reach
	// neither child.
	cmd := exec.Command(self)
	cmd.Env = []string{"=A=B", "NOEQ", "K=v", "==x", "=", envHelperSocket + "=" + sharedSocket}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s%s", err, out, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("helper said %q, want 4 lines", lines)
	}
	for i := 0; i < 4; i += 2 {
		native, err := strconv.Unquote(strings.TrimPrefix(lines[i], "exec "))
		if err != nil {
			t.Fatalf("%q: %v", lines[i], err)
		}
		zygote, err := strconv.Unquote(strings.TrimPrefix(lines[i+1], "zygote "))
		if err != nil {
			t.Fatalf("%q: %v", lines[i+1], err)
		}
		if !strings.HasPrefix(native, "=A=B\x00NOEQ\x00K=v\x00") {
			t.Fatalf("the os/exec child's environment is %q: the test set it up wrong", native)
		}
		if want := strings.Replace(native, "NOEQ\x00", "", 1); zygote != want {
			t.Errorf("spawn %d: the child's environment is\n%q, want\n%q", i/2, zygote, want)
		}
	}
	if !strings.HasSuffix(lines[3], `ADDED=1\x00"`) {
		t.Errorf("the changed environment lacks ADDED=1: %s", lines[3])
	}
}
