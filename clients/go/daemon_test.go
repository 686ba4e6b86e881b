package zygote

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests run against a real daemon: the zygote binary named by
// ZYGOTE_BIN (scripts/test sets it to target/debug/zygote).

var sharedSocket string

func TestMain(m *testing.M) {
	if socket := os.Getenv(envHelperSocket); socket != "" {
		os.Exit(envHelper(socket))
	}
	bin := zygoteBin()
	if bin == "" && inCI() {
		fmt.Fprintln(os.Stderr, "FAIL: no zygote binary under CI: set ZYGOTE_BIN=/path/to/target/debug/zygote (scripts/test does)")
		os.Exit(1)
	}
	if bin == "" {
		fmt.Fprintln(os.Stderr, "SKIP: every test but the vectors needs the zygote binary: set ZYGOTE_BIN=/path/to/target/debug/zygote (cargo build -p zygote-server)")
		_ = flag.Set("test.run", "^(TestVectors|TestDecoderRejects)$")
		os.Exit(m.Run())
	}
	d, err := startDaemon(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedSocket = d.socket
	// Example functions use DialDefault.
	os.Setenv(SocketEnv, d.socket)
	code := m.Run()
	d.stop()
	if code != 0 {
		d.printLog(os.Stderr)
	}
	d.cleanup()
	os.Exit(code)
}

// inCI reports whether this is CI's run (CI set), where every test must
// run.
func inCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false"
}

func zygoteBin() string {
	if bin := os.Getenv(BinaryEnv); bin != "" {
		return bin
	}
	if bin, err := filepath.Abs("../../target/debug/zygote"); err == nil {
		if _, err := os.Stat(bin); err == nil {
			os.Setenv(BinaryEnv, bin)
			return bin
		}
	}
	return ""
}

type daemon struct {
	dir, socket, logPath string
	cmd                  *exec.Cmd
}

// startDaemon starts `zygote serve` on a socket in a new temp directory,
// logging at debug level to a file there.
func startDaemon(bin string, args ...string) (*daemon, error) {
	dir, err := os.MkdirTemp("", "zygote-go-test-")
	if err != nil {
		return nil, err
	}
	return startDaemonIn(bin, dir, args...)
}

// startDaemonIn starts `zygote serve` on dir/zygote.sock, logging to
// dir/daemon.log (appending, for a daemon restarted in the same dir).
func startDaemonIn(bin, dir string, args ...string) (*daemon, error) {
	d := &daemon{dir: dir, socket: filepath.Join(dir, "zygote.sock"), logPath: filepath.Join(dir, "daemon.log")}
	logFile, err := os.OpenFile(d.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	d.cmd = exec.Command(bin, append([]string{"serve", "--socket", d.socket, "--log-format", "text"}, args...)...)
	d.cmd.Stdout = logFile
	d.cmd.Stderr = logFile
	d.cmd.Env = append(os.Environ(), "ZYGOTE_LOG=debug")
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := Dial(d.socket); err == nil {
			c.Close()
			return d, nil
		}
		if time.Now().After(deadline) {
			d.stop()
			var log bytes.Buffer
			d.printLog(&log)
			return nil, fmt.Errorf("the daemon did not come up at %s within 20 s; its log:\n%s", d.socket, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

func (d *daemon) printLog(w interface{ Write([]byte) (int, error) }) {
	data, _ := os.ReadFile(d.logPath)
	fmt.Fprintf(w, "---- daemon log %s ----\n%s---- end of daemon log ----\n", d.logPath, data)
}

func (d *daemon) cleanup() { os.RemoveAll(d.dir) }

// ownDaemon starts a daemon for one test, which may kill it; its log is
// printed if the test fails.
func ownDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	bin := zygoteBin()
	if bin == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	d, err := startDaemon(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.stop()
		}
		if t.Failed() {
			var b strings.Builder
			d.printLog(&b)
			t.Log(b.String())
		}
		d.cleanup()
	})
	return d
}

// dial connects to the shared daemon.
func dial(t *testing.T) *Client {
	t.Helper()
	if sharedSocket == "" {
		t.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := Dial(sharedSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
