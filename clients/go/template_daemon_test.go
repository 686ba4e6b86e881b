package zygote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The warm templates against the real daemon. They need a python3 on
// PATH and a daemon that offers templates.

// templateDaemon connects to the shared daemon, skipping the test when
// there is no python3 or the daemon does not offer templates (under CI
// the daemon must offer them).
func templateDaemon(t *testing.T) *Client {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("SKIP: needs python3 on PATH")
	}
	c := dial(t)
	if !c.Offers(featureTemplates) {
		if inCI() {
			t.Fatalf("the daemon does not offer templates (features %q)", c.Features())
		}
		t.Skipf("SKIP: the daemon does not offer templates (features %q)", c.Features())
	}
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTemplateChildRunsAsPython runs children of a template as `python
// ARGS` would run: -c with its sys.argv and exit status, -m, a script, an
// uncaught exception, and stdin and stdout through pipes.
func TestTemplateChildRunsAsPython(t *testing.T) {
	c := templateDaemon(t)
	ctx := testContext(t)
	tmpl, err := c.PythonTemplate(ctx, TemplateOptions{Preload: []string{"json"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Command("-c", "import sys, json; print(json.dumps(sys.argv)); sys.exit(3)", "a", "b").Output()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || string(out) != "[\"-c\", \"a\", \"b\"]\n" {
		t.Fatalf("-c: %q, %v; want sys.argv [-c a b] and exit status 3", out, err)
	}
	if out, err := tmpl.Command("-m", "json.tool", "--help").Output(); err != nil || !strings.Contains(string(out), "usage") {
		t.Fatalf("-m json.tool --help: %q, %v", out, err)
	}
	script := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(script, []byte("import sys\nprint(__name__, sys.argv[1:])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := tmpl.Command(script, "x").Output(); err != nil || string(out) != "__main__ ['x']\n" {
		t.Fatalf("a script: %q, %v", out, err)
	}
	out, err = tmpl.Command("-c", "raise ValueError('from the warm child')").CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "ValueError: from the warm child") {
		t.Fatalf("an uncaught exception: %q, %v; want exit 1 and the traceback", out, err)
	}
	cmd := tmpl.Command("-c", "import sys; sys.stdout.write(sys.stdin.read().upper())")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if cmd.Process.Pid <= 0 || cmd.Process.Pidfd() < 0 {
		t.Errorf("Process %+v: no pid or pidfd", cmd.Process)
	}
	io.WriteString(stdin, "piped through")
	stdin.Close()
	got, _ := io.ReadAll(stdout)
	if err := cmd.Wait(); err != nil || string(got) != "PIPED THROUGH" {
		t.Fatalf("pipes: %q, %v", got, err)
	}
}

// TestTemplateChildEnvAndDir gives a warm child its own Cmd's
// environment and directory, not the template's.
func TestTemplateChildEnvAndDir(t *testing.T) {
	c := templateDaemon(t)
	tmpl, err := c.PythonTemplate(testContext(t), TemplateOptions{Env: append(os.Environ(), "ZYGOTE_GO_TPL=template")})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cmd := tmpl.Command("-c", "import os; print(os.environ.get('ZYGOTE_GO_TPL'), os.environ.get('ZYGOTE_GO_CHILD'), os.getcwd())")
	cmd.Env = []string{"ZYGOTE_GO_CHILD=child", "PATH=" + os.Getenv("PATH")}
	cmd.Dir = dir
	out, err := cmd.Output()
	if want := "None child " + dir + "\n"; err != nil || string(out) != want {
		t.Fatalf("env and dir: %q, %v; want %q", out, err, want)
	}
}

// TestTemplateReusedAndListed finds the running template for the same
// options, and lists it.
func TestTemplateReusedAndListed(t *testing.T) {
	c := templateDaemon(t)
	ctx := testContext(t)
	opts := TemplateOptions{Preload: []string{"json", "email.mime.text"}, Env: []string{"PATH=" + os.Getenv("PATH"), "ZYGOTE_GO_TPL=listed"}}
	first, err := c.PythonTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.PythonTemplate(ctx, opts)
	if err != nil || !again.Reused() || again.Handle() != first.Handle() || again.Pid() != first.Pid() {
		t.Fatalf("the same options again: %+v, %v; want template %d reused", again, err, first.Handle())
	}
	if err := first.Command("-c", "pass").Run(); err != nil {
		t.Fatal(err)
	}
	list, err := c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range list {
		if info.ID == first.Handle() {
			if info.Pid != first.Pid() || info.UID != uint32(os.Getuid()) || info.Kind != "python" || info.Python != "python3" ||
				strings.Join(info.Preload, ",") != "json,email.mime.text" || info.Forks < 1 || info.RSS == 0 {
				t.Errorf("listed as %+v", info)
			}
			return
		}
	}
	t.Fatalf("template %d not in the list %+v", first.Handle(), list)
}

// TestTemplateFailures reports a missing interpreter, a missing module
// and a preload that raises, with its traceback, and keeps serving.
func TestTemplateFailures(t *testing.T) {
	c := templateDaemon(t)
	ctx := testContext(t)
	var te *TemplateError
	_, err := c.PythonTemplate(ctx, TemplateOptions{Python: "/nonexistent/python3"})
	if !errors.As(err, &te) || te.Errno != syscall.ENOENT {
		t.Errorf("a missing interpreter: %v, want ENOENT", err)
	}
	_, err = c.PythonTemplate(ctx, TemplateOptions{Preload: []string{"zygote_go_no_such_module"}})
	if !errors.As(err, &te) || te.Errno != syscall.EPROTO || !strings.Contains(te.Message, "zygote_go_no_such_module") {
		t.Errorf("a missing module: %v, want EPROTO naming it", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "zygote_go_raises.py"), []byte("raise RuntimeError('preload went wrong')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.PythonTemplate(ctx, TemplateOptions{Preload: []string{"zygote_go_raises"},
		Env: []string{"PATH=" + os.Getenv("PATH"), "PYTHONPATH=" + dir}})
	if !errors.As(err, &te) || te.Errno != syscall.EPROTO || !strings.Contains(te.Message, "RuntimeError: preload went wrong") ||
		!strings.Contains(te.Message, "Traceback") {
		t.Errorf("a preload that raises: %v, want EPROTO with the traceback", err)
	}
	if out, err := c.Command("/bin/echo", "still").Output(); err != nil || string(out) != "still\n" {
		t.Fatalf("a spawn after the failures: %q, %v", out, err)
	}
}

// TestTemplateChildCancelAndTimeout ends warm children: a context's
// cancel kills one, Kill another, and the zygote's timeout a third.
func TestTemplateChildCancelAndTimeout(t *testing.T) {
	c := templateDaemon(t)
	tmpl, err := c.PythonTemplate(testContext(t), TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sleep := []string{"-c", "import time; time.sleep(60)"}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := tmpl.CommandContext(ctx, sleep...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	cancel()
	err = cmd.Wait()
	// As os/exec: the exit the cancel caused, not the context's error.
	var ee *ExitError
	if !errors.As(err, &ee) || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL ||
		time.Since(began) > 20*time.Second {
		t.Fatalf("cancelled: %v, %v after %v; want an ExitError for SIGKILL", err, cmd.ProcessState, time.Since(began))
	}

	cmd = tmpl.Command(sleep...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); cmd.ProcessState == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("killed: %v, %v", err, cmd.ProcessState)
	}

	cmd = tmpl.Command(sleep...)
	cmd.Zygote.Timeout = 300 * time.Millisecond
	began = time.Now()
	if err := cmd.Run(); cmd.ProcessState == nil || !cmd.ProcessState.TimedOut() || time.Since(began) > 20*time.Second {
		t.Fatalf("timeout: %v, %v after %v; want timed out", err, cmd.ProcessState, time.Since(began))
	}
}

// TestTemplateChildrenDoNotShareRandom checks that two warm children
// draw different random numbers (the fork reseeds them).
func TestTemplateChildrenDoNotShareRandom(t *testing.T) {
	c := templateDaemon(t)
	tmpl, err := c.PythonTemplate(testContext(t), TemplateOptions{Preload: []string{"random"}})
	if err != nil {
		t.Fatal(err)
	}
	draw := func() string {
		out, err := tmpl.Command("-c", "import random; print(random.getrandbits(64))").Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	if a, b := draw(), draw(); a == b {
		t.Fatalf("two children drew the same number %s", a)
	}
}

// anotherUIDTemplate is a peer of uid 65534, in Python, that asks the
// zygote at argv[1] for a template, prints its handle, and keeps its
// connection (and so the template) until its stdin closes.
const anotherUIDTemplate = `
import socket, sys
def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80]); n >>= 7
    return out + bytes([n])
def text(b): return varint(len(b)) + b
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(varint(0) + varint(4) + text(b"test"))
s.recv(65536)
env = varint(1) + text(b"PATH") + text(b"/usr/bin:/bin")
s.send(varint(5) + varint(1) + text(b"python") + text(b"/usr/bin/python3") + varint(0) + env + b"\x01" + text(b"/"))
reply = s.recv(65536)
if reply[0] != 10:
    sys.exit("no TemplateReady: " + reply.hex())
values, shift, value = [], 0, 0
for byte in reply[1:]:
    value |= (byte & 0x7F) << shift; shift += 7
    if byte < 0x80:
        values.append(value); shift, value = 0, 0
print(values[1], flush=True)
sys.stdin.read()
`

// TestTemplateOfAnotherUIDRefused spawns, as root, from a template of
// uid 65534: the zygote refuses (EPERM at Validate), and the Template
// does not take that for a template that is gone.
func TestTemplateOfAnotherUIDRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("SKIP: needs root, to start a peer of another uid")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("SKIP: needs /usr/bin/python3, which uid 65534 can run")
	}
	d := ownDaemon(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Offers(featureTemplates) {
		t.Skipf("SKIP: the daemon does not offer templates (features %q)", c.Features())
	}
	// Let uid 65534 reach the socket.
	if err := os.Chmod(d.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d.socket, 0o777); err != nil {
		t.Fatal(err)
	}
	peer := c.Command("/usr/bin/python3", "-c", anotherUIDTemplate, d.socket)
	peer.Zygote.Credential = &Credential{Uid: 65534, Gid: 65534}
	peer.Dir = "/"
	peer.Stderr = os.Stderr
	stdin, err := peer.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := peer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = peer.Wait()
	}()
	line := make([]byte, 32)
	n, err := stdout.Read(line)
	var handle uint64
	if _, scanErr := fmt.Sscan(string(line[:n]), &handle); err != nil || scanErr != nil {
		t.Fatalf("the other uid's peer printed %q (%v, %v)", line[:n], err, scanErr)
	}
	foreign := &Template{client: c, spec: templateRequest{Kind: "python", Interpreter: bstr("/usr/bin/python3")},
		conn: c.cur.Load(), handle: handle}
	err = foreign.Command("-c", "print('not for root')").Run()
	var se *StartError
	if !errors.As(err, &se) || se.Stage != "Validate" || se.Errno != syscall.EPERM {
		t.Fatalf("a spawn from template %d of uid 65534: %v, want EPERM at Validate", handle, err)
	}
	if foreign.Handle() != handle {
		t.Fatalf("the Template asked for a template of its own (handle %d), as if %d were gone", foreign.Handle(), handle)
	}
}

// TestTemplateGoneIsAskedForAgain spawns from a template the zygote
// stopped when this uid's last connection closed: the spawn is refused
// (ENOENT), and the Template asks for the template again and retries, so
// the child runs.
func TestTemplateGoneIsAskedForAgain(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("SKIP: needs python3 on PATH")
	}
	d := ownDaemon(t)
	first, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Offers(featureTemplates) {
		first.Close()
		t.Skipf("SKIP: the daemon does not offer templates (features %q)", first.Features())
	}
	old, err := first.PythonTemplate(testContext(t), TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	// The zygote stops the template once it has seen the connection go.
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(old.Pid(), 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("template %d (pid %d) still runs 20 s after its uid's last connection closed", old.Handle(), old.Pid())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stale := &Template{client: c, spec: old.spec, conn: c.cur.Load(), handle: old.Handle(), pid: old.Pid()}
	out, err := stale.Command("-c", "print('warm again')").Output()
	if err != nil || string(out) != "warm again\n" {
		t.Fatalf("a spawn from the stopped template: %q, %v", out, err)
	}
	if stale.Handle() == old.Handle() || stale.Pid() == old.Pid() {
		t.Fatalf("handle %d pid %d: the template was not asked for again", stale.Handle(), stale.Pid())
	}
}
