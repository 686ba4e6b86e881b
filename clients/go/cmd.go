package zygote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// defaultTimeoutGrace is the time between a timeout's SIGTERM and SIGKILL,
// unless Options.TimeoutGrace says otherwise (as in the Rust client).
const defaultTimeoutGrace = 5 * time.Second

// Credential is who a child runs as.
type Credential struct {
	Uid    uint32
	Gid    uint32
	Groups []uint32 // supplementary groups, replacing the peer's
}

// Rlimit is one resource limit; ^uint64(0) is RLIM_INFINITY.
type Rlimit struct {
	Resource int // an RLIMIT_* number, e.g. syscall.RLIMIT_NOFILE
	Cur, Max uint64
}

// Options are the zygote's own settings for one child, beyond os/exec's.
// The zero value asks for nothing.
type Options struct {
	// Credential runs the child as another user; the daemon's policy
	// decides whether this peer may. Nil runs it as this process's user.
	Credential *Credential
	// Setsid starts a new session (setsid(2)).
	Setsid bool
	// Setpgid puts the child in process group Pgid (0: a new group led by
	// the child), as syscall.SysProcAttr does. Ignored with Setsid.
	Setpgid bool
	Pgid    int
	// Umask sets the child's umask; nil copies this process's.
	Umask *uint32
	// Rlimits override these resources' limits; the others are copied
	// from this process.
	Rlimits []Rlimit
	// KillOnClose is the signal the daemon sends the child when this
	// Client's connection closes for any reason, this program's death
	// included (0: none). With KillProcessGroup it goes to the child's
	// process group, which needs Setsid or Setpgid.
	KillOnClose      syscall.Signal
	KillProcessGroup bool
	// Timeout ends the child after this run time: SIGTERM, then SIGKILL
	// after TimeoutGrace (default 5 s). Zero means no timeout.
	Timeout      time.Duration
	TimeoutGrace time.Duration
	// Cgroup limits the child's own cgroup, or makes kills and Wait cover
	// its whole tree; nil asks for none of it. The daemon refuses the
	// spawn (a *StartError at stage Cgroup) when it has no cgroup subtree
	// or a limit's controller is not delegated to it: a limit is never
	// silently ignored.
	Cgroup *CgroupOptions
	// Sandbox confines the child (see Sandbox); nil asks for none. What
	// was applied is in Process.Sandbox.
	Sandbox *Sandbox
	// Template makes the child a fork of a warm template instead of a new
	// program (see Template.Command): Args[1:] are its Python arguments,
	// Path and Args[0] only name it. Credential and Sandbox cannot be
	// honoured for such a child and are refused.
	Template *Template
}

// CgroupOptions are settings of the cgroup the zygote creates for one
// child, which its descendants share (cgroup v2). A zero number leaves
// that limit unset.
type CgroupOptions struct {
	// KillTree makes the timeout, kill-on-close and Process.Kill end the
	// child's whole cgroup (cgroup.kill, Linux 5.14): grandchildren that
	// left its process group or session too.
	KillTree bool
	// WaitTree makes Wait return only once every process of the child's
	// cgroup has exited, not just the child.
	WaitTree bool
	// MemoryMax is memory.max in bytes: the whole tree's memory. A child
	// the OOM killer ended reports ProcessState.OOMKilled.
	MemoryMax uint64
	// MemorySwapMax is memory.swap.max in bytes.
	MemorySwapMax uint64
	// PidsMax is pids.max: at most this many processes and threads.
	PidsMax uint64
	// CPUQuota of CPU time per CPUPeriod (default 100 ms) is cpu.max.
	CPUQuota  time.Duration
	CPUPeriod time.Duration
	// CPUWeight and IOWeight are cpu.weight and io.weight (1 to 10000,
	// default 100).
	CPUWeight uint32
	IOWeight  uint32
}

// spec is the request's form of the options.
func (o *CgroupOptions) spec() *cgroupSpec {
	s := &cgroupSpec{KillTree: o.KillTree, WaitTree: o.WaitTree}
	nonZero := func(v uint64) *uint64 {
		if v == 0 {
			return nil
		}
		return &v
	}
	s.MemoryMax = nonZero(o.MemoryMax)
	s.MemorySwapMax = nonZero(o.MemorySwapMax)
	s.PidsMax = nonZero(o.PidsMax)
	if o.CPUQuota > 0 {
		period := o.CPUPeriod
		if period <= 0 {
			period = 100 * time.Millisecond
		}
		s.CPUMax = &cpuMax{QuotaMicros: uint64(max(o.CPUQuota.Microseconds(), 1)), PeriodMicros: uint64(max(period.Microseconds(), 1))}
	}
	if o.CPUWeight != 0 {
		w := o.CPUWeight
		s.CPUWeight = &w
	}
	if o.IOWeight != 0 {
		w := o.IOWeight
		s.IOWeight = &w
	}
	return s
}

// Cmd is a command to run through the zygote. Its fields have the meaning
// of os/exec's; see the package documentation for what differs.
type Cmd struct {
	// Path is the program. Without a slash it is looked up in the PATH of
	// the child's environment, by the zygote, when the child execs.
	Path string
	// Args holds the arguments, Args[0] included (the argv[0] the child
	// sees). Empty means []string{Path}.
	Args []string
	// Env is the child's whole environment, as "key=value" strings; nil
	// means this process's environment. Keys are split as os/exec does
	// (the inherited "=A=B" is key "=A") and reach the child as given; an
	// entry without "=" is left out, where os/exec passes it on.
	Env []string
	// Dir is the working directory; "" means this process's.
	Dir string

	// Stdin, Stdout and Stderr: nil is /dev/null; an *os.File is passed
	// to the child as it is; anything else is copied through a pipe by a
	// goroutine.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// ExtraFiles become the child's fds 3, 4, ...; a nil entry leaves that
	// fd closed in the child.
	ExtraFiles []*os.File

	// Zygote holds the zygote's own options.
	Zygote Options

	// Err is an error Command found before the start, such as a program
	// named without a slash that is on no directory of this process's
	// PATH; Start returns it.
	Err error

	// Process is the child, once started.
	Process *Process
	// ProcessState is how it ended, once Wait returned.
	ProcessState *ProcessState

	// Cancel is called when the context of CommandContext is done before
	// the child exits. CommandContext sets it to kill the child.
	Cancel func() error
	// WaitDelay bounds the time Wait waits, after the child exits or
	// after Cancel, for its I/O to finish; then it kills the child and
	// closes the pipes, as os/exec does.
	WaitDelay time.Duration

	client *Client
	ctx    context.Context

	childFiles []*os.File  // our copies of ends given to the child, closed after start
	parentIO   []io.Closer // pipe ends Wait closes after the child exits
	goroutines []func() error
	goErr      chan error
	ctxResult  chan ctxResult
	waitDone   chan struct{}
	waited     bool
	started    bool
}

type ctxResult struct {
	err   error
	timer *time.Timer
}

// Command returns a Cmd to run name with args through this Client.
//
// As in os/exec, a name without a slash is looked up in this process's
// PATH (exec.LookPath, with its exec.ErrDot rule), and Path is set to
// what was found; when nothing is, Err is set, errors.Is(Err,
// exec.ErrNotFound) and errors.Is(Err, syscall.ENOENT) hold, and Start
// returns it.
func (c *Client) Command(name string, arg ...string) *Cmd {
	cmd := Command(name, arg...)
	cmd.client = c
	return cmd
}

// CommandContext is Command with a context: when ctx is done before the
// child exits, Cancel is called (by default it kills the child), and then
// WaitDelay applies. A nil Cancel, as in os/exec, leaves the child alone:
// Wait then only stops waiting for its I/O once WaitDelay has passed
// (killing it then), or, with no WaitDelay, the context has no effect.
func (c *Client) CommandContext(ctx context.Context, name string, arg ...string) *Cmd {
	cmd := CommandContext(ctx, name, arg...)
	cmd.client = c
	return cmd
}

// Command is Client.Command through the default client (see
// DefaultClient), dialled when the Cmd starts. A Cmd literal, such as
// &Cmd{Path: "/bin/true"}, uses the default client too.
func Command(name string, arg ...string) *Cmd {
	cmd := &Cmd{Path: name, Args: append([]string{name}, arg...)}
	if name != "" && !containsSlash(name) {
		lp, err := exec.LookPath(name)
		if lp != "" {
			cmd.Path = lp
		}
		if err != nil {
			se := &StartError{Program: name, Stage: "LookPath", Message: err.Error(), cause: err}
			if errors.Is(err, exec.ErrNotFound) {
				se.Errno = syscall.ENOENT
			}
			cmd.Err = se
		}
	}
	return cmd
}

// CommandContext is Client.CommandContext through the default client.
func CommandContext(ctx context.Context, name string, arg ...string) *Cmd {
	if ctx == nil {
		panic("nil Context")
	}
	cmd := Command(name, arg...)
	cmd.ctx = ctx
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	return cmd
}

// String is the command line, for logs.
func (c *Cmd) String() string {
	b := new(strings.Builder)
	b.WriteString(c.Path)
	for _, a := range c.argv()[1:] {
		b.WriteByte(' ')
		b.WriteString(a)
	}
	return b.String()
}

func (c *Cmd) argv() []string {
	if len(c.Args) > 0 {
		return c.Args
	}
	return []string{c.Path}
}

// Environ is the environment the child would get.
func (c *Cmd) Environ() []string {
	env, _ := c.environ()
	return env
}

// environ mirrors os/exec: this process's environment (with PWD set to Dir
// when Dir is set) unless Env is set, and the last of duplicate keys wins.
// Unlike os/exec, an entry without "=" is left out.
func (c *Cmd) environ() ([]string, error) {
	return c.environFrom(os.Environ())
}

// environFrom is environ with own as this process's environment.
func (c *Cmd) environFrom(own []string) ([]string, error) {
	env := c.Env
	var err error
	if env == nil {
		env = own
		if c.Dir != "" {
			if pwd, absErr := filepath.Abs(c.Dir); absErr == nil {
				env = append(env, "PWD="+pwd)
			} else {
				err = absErr
			}
		}
	}
	seen := make(map[string]bool, len(env))
	out := make([]string, 0, len(env))
	for i := len(env) - 1; i >= 0; i-- {
		kv := env[i]
		if strings.IndexByte(kv, 0) >= 0 {
			return nil, errors.New("exec: environment variable contains NUL")
		}
		i := envKeyEnd(kv)
		if i < 0 {
			// No variable: os/exec would pass it on raw, which the
			// protocol cannot carry (PROTOCOL.md 4.7).
			continue
		}
		k := kv[:i]
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, kv)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, err
}

// envKeyEnd is where an environment entry's key ends (the index of its
// "="), as os/exec splits it: a leading "=" belongs to the key, so the
// inherited "=A=B" is key "=A". It is -1 for an entry with no "=", which
// names no variable.
func envKeyEnd(kv string) int {
	if strings.HasPrefix(kv, "=") {
		if i := strings.IndexByte(kv[1:], '='); i >= 0 {
			return i + 1
		}
		// "=" alone or "=A": key "", as os/exec reads it.
		return 0
	}
	return strings.IndexByte(kv, '=')
}

// envCache is the process environment that envVars last turned into
// request variables. It rarely changes, and checking, deduplicating and
// encoding it for every spawn cost a map, three slices and most of the
// encoder's time.
type envCache struct {
	raw     []string // as syscall.Environ returned it
	vars    []envVar // shared by requests, which only read it
	encoded []byte   // vars encoded, shared likewise
}

var lastEnv atomic.Pointer[envCache]

// envVars is the child's environment (see environ) as request variables,
// and their encoding when they are this process's (nil otherwise).
func (c *Cmd) envVars() ([]envVar, []byte, error) {
	inherit := c.Env == nil && c.Dir == ""
	var raw []string
	if inherit {
		// Comparing is cheap: an unchanged entry is the same string.
		raw = syscall.Environ()
		if e := lastEnv.Load(); e != nil && slices.Equal(e.raw, raw) {
			return e.vars, e.encoded, nil
		}
	}
	if !inherit && c.Env == nil {
		raw = os.Environ()
	}
	env, err := c.environFrom(raw)
	if err != nil {
		return nil, nil, err
	}
	vars := make([]envVar, 0, len(env))
	for _, kv := range env {
		i := envKeyEnd(kv)
		vars = append(vars, envVar{Key: strBytes(kv[:i]), Value: strBytes(kv[i+1:])})
	}
	if !inherit {
		return vars, nil, nil
	}
	e := &encoder{}
	e.env(vars)
	lastEnv.Store(&envCache{raw: raw, vars: vars, encoded: e.b})
	return vars, e.b, nil
}

func noNUL(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("zygote: %s %q contains a NUL byte", what, s)
	}
	return nil
}

// StdinPipe returns a pipe to the child's stdin. Wait closes it after the
// child exits; close it earlier to send end of file.
func (c *Cmd) StdinPipe() (io.WriteCloser, error) {
	if c.Stdin != nil {
		return nil, errors.New("exec: Stdin already set")
	}
	if c.started {
		return nil, errors.New("exec: StdinPipe after process started")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	c.Stdin = r
	c.childFiles = append(c.childFiles, r)
	wc := &closeOnce{File: w}
	c.parentIO = append(c.parentIO, wc)
	return wc, nil
}

// StdoutPipe returns a pipe from the child's stdout. Wait closes it after
// the child exits, so read everything before calling Wait.
func (c *Cmd) StdoutPipe() (io.ReadCloser, error) {
	if c.Stdout != nil {
		return nil, errors.New("exec: Stdout already set")
	}
	return c.outPipe(&c.Stdout, "StdoutPipe")
}

// StderrPipe returns a pipe from the child's stderr, as StdoutPipe.
func (c *Cmd) StderrPipe() (io.ReadCloser, error) {
	if c.Stderr != nil {
		return nil, errors.New("exec: Stderr already set")
	}
	return c.outPipe(&c.Stderr, "StderrPipe")
}

func (c *Cmd) outPipe(field *io.Writer, name string) (io.ReadCloser, error) {
	if c.started {
		return nil, errors.New("exec: " + name + " after process started")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	*field = w
	c.childFiles = append(c.childFiles, w)
	c.parentIO = append(c.parentIO, r)
	return r, nil
}

type closeOnce struct {
	*os.File
	once sync.Once
	err  error
}

func (c *closeOnce) Close() error {
	c.once.Do(func() { c.err = c.File.Close() })
	return c.err
}

// attachment collects the fds a spawn frame carries.
type attachment struct {
	fds   []int
	files []*os.File // kept alive until the frame is sent
}

func (a *attachment) add(f *os.File) (uint32, error) {
	// Fd puts the file in blocking mode, as os/exec does for the files
	// it passes: the child shares the open file description, and few
	// programs expect O_NONBLOCK on their stdio (os.Pipe sets it).
	raw := int(f.Fd())
	if raw < 0 {
		return 0, fmt.Errorf("zygote: passing %s to the child: %w", f.Name(), os.ErrClosed)
	}
	for i, fd := range a.fds {
		if fd == raw {
			return uint32(i), nil
		}
	}
	a.fds = append(a.fds, raw)
	a.files = append(a.files, f)
	return uint32(len(a.fds) - 1), nil
}

// Run starts the command and waits for it.
//
// Unlike Start, Run asks the daemon to defer the child's pidfd: a child
// that ends within 10 to 20 ms is reported by its exit notice alone,
// which saves a message and an fd per spawn. Until the child is known,
// Process.Pid is 0 and Process.Signal (and so Cancel and WaitDelay) goes
// through the daemon by spawn id. A daemon lost before that has no pidfd
// to recover the exit status from: Run then returns a *ConnectionError.
// Output and CombinedOutput defer in the same way. A command with a
// Sandbox is not deferred, so that Process.Sandbox always says what
// confined it, nor one with a Template, whose spawn may be retried
// (see Template).
func (c *Cmd) Run() error {
	if err := c.start(c.Zygote.Sandbox == nil && c.Zygote.Template == nil); err != nil {
		return err
	}
	err := c.Wait()
	if p := c.Process; p.startErr != nil {
		// The daemon refused or failed the spawn: no child was left.
		c.Process = nil
		return p.startErr
	}
	return err
}

// Output runs the command and returns its stdout. An *ExitError carries
// the child's stderr when Stderr was not set.
func (c *Cmd) Output() ([]byte, error) {
	if c.Stdout != nil {
		return nil, errors.New("exec: Stdout already set")
	}
	var stdout bytes.Buffer
	c.Stdout = &stdout
	var stderr *prefixSuffixSaver
	if c.Stderr == nil {
		stderr = &prefixSuffixSaver{N: 32 << 10}
		c.Stderr = stderr
	}
	err := c.Run()
	if stderr != nil {
		var ee *ExitError
		if errors.As(err, &ee) {
			ee.Stderr = stderr.Bytes()
		}
	}
	return stdout.Bytes(), err
}

// CombinedOutput runs the command and returns its stdout and stderr,
// interleaved through one pipe.
func (c *Cmd) CombinedOutput() ([]byte, error) {
	if c.Stdout != nil {
		return nil, errors.New("exec: Stdout already set")
	}
	if c.Stderr != nil {
		return nil, errors.New("exec: Stderr already set")
	}
	var b syncBuffer
	c.Stdout = &b
	c.Stderr = &b
	err := c.Run()
	return b.Bytes(), err
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Bytes()
}

// prefixSuffixSaver keeps the first and last N bytes written, as os/exec
// does for ExitError.Stderr.
type prefixSuffixSaver struct {
	N       int
	prefix  []byte
	suffix  []byte
	skipped int64
}

func (w *prefixSuffixSaver) Write(p []byte) (int, error) {
	n := len(p)
	if room := w.N - len(w.prefix); room > 0 {
		take := min(room, len(p))
		w.prefix = append(w.prefix, p[:take]...)
		p = p[take:]
	}
	w.suffix = append(w.suffix, p...)
	if over := len(w.suffix) - w.N; over > 0 {
		w.skipped += int64(over)
		w.suffix = append(w.suffix[:0], w.suffix[over:]...)
	}
	return n, nil
}

func (w *prefixSuffixSaver) Bytes() []byte {
	if w.skipped == 0 {
		return append(w.prefix, w.suffix...)
	}
	return append(append(w.prefix, fmt.Sprintf("\n... omitting %d bytes ...\n", w.skipped)...), w.suffix...)
}

// stream is one of stdin, stdout, stderr while a request is built.
type stream struct {
	spec   stdioSpec
	piped  bool                            // the daemon returns our end
	local  *os.File                        // or our end of a pipe made here
	bridge func(end *os.File) func() error // the copying goroutine for a pipe
}

// Start starts the command and returns once the child has exec'd (or
// failed to). Wait must be called to release its resources.
func (c *Cmd) Start() error {
	return c.start(false)
}

// start starts the command. With deferred (Run), the request asks for
// defer_spawned and start returns once it is sent: Wait receives the
// first reply (see Process.adopt). Deferral forbids pipes made by the
// daemon, so build makes them here.
func (c *Cmd) start(deferred bool) (err error) {
	// As os/exec: a second Start fails before anything of the first is
	// touched.
	if c.started {
		return errors.New("exec: already started")
	}
	c.started = true
	defer func() {
		if err != nil {
			c.releaseIO()
		}
	}()
	if err := c.startable(); err != nil {
		return err
	}
	p, err := c.build(deferred)
	if err != nil {
		return err
	}
	p.req.DeferSpawned = deferred
	if t := c.Zygote.Template; t != nil {
		return c.startFromTemplate(t, p)
	}
	cl := c.client
	conn, pending, err := cl.request(true, deferred, func(id uint64) *clientMessage {
		p.req.ID = id
		return &clientMessage{Spawn: p.req}
	}, p.att.fds)
	// The frame holds its own references to the fds now.
	runtime.KeepAlive(p.att.files)
	if err != nil {
		return err
	}
	proc := &Process{client: cl, conn: conn, spawnID: p.req.ID, pending: pending, pidfd: -1,
		program: c.Path, killTree: c.Zygote.Cgroup != nil && c.Zygote.Cgroup.KillTree}
	if deferred {
		// The frame in flight holds the daemon's copies of the fds.
		c.closeChildFiles()
		proc.deferred = true
		c.Process = proc
		c.startIO(p, nil)
		return nil
	}
	ends, err := c.awaitSpawned(proc, p)
	if err != nil {
		return err
	}
	c.Process = proc
	c.startIO(p, ends)
	return nil
}

// startable checks what os/exec checks before starting, in its order, and
// finds the client: this Cmd's, or the default one for Command and Cmd
// literals.
func (c *Cmd) startable() error {
	if c.Zygote.Template != nil && c.Err == nil {
		c.Err = c.templateClient()
	}
	if c.Path == "" && c.Err == nil {
		c.Err = errors.New("exec: no command")
	}
	if c.Err != nil {
		return c.Err
	}
	if c.Cancel != nil && c.ctx == nil {
		return errors.New("exec: command with a non-nil Cancel was not created with CommandContext")
	}
	if c.ctx != nil {
		select {
		case <-c.ctx.Done():
			return c.ctx.Err()
		default:
		}
	}
	if c.client == nil {
		cl, err := DefaultClient()
		if err != nil {
			return err
		}
		c.client = cl
	}
	return nil
}

// releaseIO closes every pipe end a start that failed made or was given.
func (c *Cmd) releaseIO() {
	c.closeChildFiles()
	closeAll(c.parentIO)
	c.parentIO = nil
}

// closeChildFiles closes our copies of the ends given to the child.
func (c *Cmd) closeChildFiles() {
	closeFiles(c.childFiles)
	c.childFiles = nil
}

// awaitSpawned waits for the first reply of a spawn that was not deferred
// and fills in proc from it; it returns the pipe ends the daemon made.
func (c *Cmd) awaitSpawned(proc *Process, p *plan) ([]int, error) {
	r, err := proc.conn.await(proc.pending)
	// The daemon has its copies (or is done with them): ours can go.
	c.closeChildFiles()
	return c.spawnedFrom(proc, p, r, err)
}

// spawnedFrom fills in proc from the first reply to its spawn, r (or the
// error that came instead); it returns the pipe ends the daemon made.
func (c *Cmd) spawnedFrom(proc *Process, p *plan, r reply, err error) ([]int, error) {
	if err != nil {
		return nil, fmt.Errorf("zygote: starting %q: %w", c.Path, err)
	}
	m := r.msg
	if f := m.SpawnFailed; f != nil {
		closeFds(r.fds)
		return nil, &StartError{Program: c.Path, Stage: f.Stage.String(), Errno: syscall.Errno(f.Errno), Message: f.Message}
	}
	npiped := 0
	for _, s := range p.streams {
		if s.piped {
			npiped++
		}
	}
	if m.Spawned == nil || len(r.fds) != 1+npiped {
		closeFds(r.fds)
		got := m.name()
		if m.Spawned != nil {
			got = fmt.Sprintf("Spawned with %d fds", len(r.fds))
		}
		return nil, &ProtocolError{Expected: fmt.Sprintf("Spawned with %d fds or SpawnFailed", 1+npiped), Got: got}
	}
	proc.Pid = int(m.Spawned.Pid)
	proc.Sandbox = newAppliedSandbox(m.Spawned.Sandbox)
	proc.pidfd = r.fds[0]
	return r.fds[1:], nil
}

// startIO starts the copying goroutines, on the pipe ends the daemon
// returned (ends, in stream order) or that build made, and the context's
// watcher.
func (c *Cmd) startIO(p *plan, ends []int) {
	if p.sharedOut != nil {
		c.goroutines = append(c.goroutines, copyOut(c.Stdout, p.sharedOut))
	}
	for _, s := range p.streams {
		switch {
		case s.piped:
			end := pipeEnd(ends[0])
			ends = ends[1:]
			c.parentIO = append(c.parentIO, end)
			c.goroutines = append(c.goroutines, s.bridge(end))
		case s.local != nil:
			// Already in parentIO, from build.
			c.goroutines = append(c.goroutines, s.bridge(s.local))
		}
	}
	if len(c.goroutines) > 0 {
		c.goErr = make(chan error, 1)
		gs := c.goroutines
		c.goroutines = nil
		go func() {
			var wg sync.WaitGroup
			errs := make([]error, len(gs))
			for i, g := range gs {
				wg.Add(1)
				go func(i int, g func() error) {
					defer wg.Done()
					errs[i] = g()
				}(i, g)
			}
			wg.Wait()
			c.goErr <- firstErr(errs)
		}()
	}
	// As os/exec: with neither Cancel nor WaitDelay, the context is not
	// watched at all.
	if (c.Cancel != nil || c.WaitDelay != 0) && c.ctx != nil && c.ctx.Done() != nil {
		c.waitDone = make(chan struct{})
		c.ctxResult = make(chan ctxResult, 1)
		go c.watchCtx()
	}
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// plan is a spawn request being built: the request, the fds its frame
// carries, and how each of stdin, stdout and stderr is served.
type plan struct {
	req     *spawnRequest
	att     attachment
	streams [3]stream
	// sharedOut is our end of the pipe that stdout and stderr share when
	// they are one writer, made here; Wait closes it.
	sharedOut *os.File
}

// build turns the Cmd into a request: each step checks its values
// against their wire types and fails with a clear error rather than
// send something the daemon would misread. The pipe ends it makes are in
// c.childFiles and c.parentIO, which a failed start closes.
func (c *Cmd) build(deferred bool) (*plan, error) {
	p := &plan{}
	var err error
	if p.req, err = c.buildProgram(); err != nil {
		return nil, err
	}
	if err := c.buildStdin(p, deferred); err != nil {
		return nil, err
	}
	if err := c.buildOutputs(p, deferred); err != nil {
		return nil, err
	}
	p.req.Stdin, p.req.Stdout, p.req.Stderr = p.streams[0].spec, p.streams[1].spec, p.streams[2].spec
	for i, f := range c.ExtraFiles {
		if f == nil {
			continue
		}
		idx, err := p.att.add(f)
		if err != nil {
			return nil, err
		}
		p.req.FdMappings = append(p.req.FdMappings, fdMapping{AttachedIndex: idx, ChildFd: int32(3 + i)})
	}
	if err := c.buildOptions(p.req); err != nil {
		return nil, err
	}
	return p, nil
}

// buildProgram is the request's program, arguments, environment and
// working directory.
func (c *Cmd) buildProgram() (*spawnRequest, error) {
	argv := c.argv()
	if err := noNUL("argument", c.Path); err != nil {
		return nil, err
	}
	for _, a := range argv {
		if err := noNUL("argument", a); err != nil {
			return nil, err
		}
	}
	env, envEncoded, err := c.envVars()
	if err != nil {
		return nil, err
	}
	cwd, err := c.cwd()
	if err != nil {
		return nil, err
	}
	if err := noNUL("directory", cwd); err != nil {
		return nil, err
	}
	req := &spawnRequest{
		Program: strBytes(c.Path),
		Args:    make([]bstr, 0, len(argv)-1),
		Env:     env,
		Cwd:     optBytes(strBytes(cwd)),

		envEncoded: envEncoded,
	}
	if c.Zygote.Template != nil {
		// The template's interpreter runs the arguments: no program, no argv0.
		if err := checkPythonArgs(argv[1:]); err != nil {
			return nil, err
		}
		req.Program = bstr{}
	} else if argv[0] != c.Path {
		req.Argv0 = optBytes(strBytes(argv[0]))
	}
	for _, a := range argv[1:] {
		req.Args = append(req.Args, strBytes(a))
	}
	return req, nil
}

// buildStdin: nil is /dev/null, a file is passed as it is, anything else
// is fed through a pipe.
func (c *Cmd) buildStdin(p *plan, deferred bool) error {
	switch in := c.Stdin.(type) {
	case nil:
	case *os.File:
		i, err := p.att.add(in)
		if err != nil {
			return err
		}
		p.streams[0].spec = stdioSpec{Kind: stdioFd, Fd: i}
	default:
		p.streams[0] = stream{spec: stdioSpec{Kind: stdioPipe}, piped: true, bridge: func(end *os.File) func() error {
			return copyIn(end, in)
		}}
		if deferred {
			return c.localPipe(&p.streams[0], &p.att, true)
		}
	}
	return nil
}

// buildOutputs serves stdout and stderr; one writer for both shares one
// pipe, as in os/exec.
func (c *Cmd) buildOutputs(p *plan, deferred bool) error {
	shared := interfaceEqual(c.Stderr, c.Stdout)
	for i, w := range []io.Writer{c.Stdout, c.Stderr} {
		s := &p.streams[i+1]
		switch out := w.(type) {
		case nil:
		case *os.File:
			idx, err := p.att.add(out)
			if err != nil {
				return err
			}
			s.spec = stdioSpec{Kind: stdioFd, Fd: idx}
		default:
			if i == 1 && shared {
				return c.sharedOutputPipe(p)
			}
			*s = stream{spec: stdioSpec{Kind: stdioPipe}, piped: true, bridge: func(end *os.File) func() error {
				return copyOut(out, end)
			}}
			// (For stdout shared with stderr, the next turn makes one pipe.)
			if deferred && !(i == 0 && shared) {
				if err := c.localPipe(s, &p.att, false); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// sharedOutputPipe makes the one pipe stdout and stderr share.
func (c *Cmd) sharedOutputPipe(p *plan) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	c.childFiles = append(c.childFiles, w)
	c.parentIO = append(c.parentIO, r)
	idx, err := p.att.add(w)
	if err != nil {
		return err
	}
	p.sharedOut = r
	p.streams[1] = stream{spec: stdioSpec{Kind: stdioFd, Fd: idx}}
	p.streams[2] = stream{spec: stdioSpec{Kind: stdioFd, Fd: idx}}
	return nil
}

// buildOptions copies this process's settings and the zygote's options
// into the request, each checked against what the child's setup call
// accepts (EINVAL, as that call would fail) and against its wire type.
func (c *Cmd) buildOptions(req *spawnRequest) error {
	o := &c.Zygote
	settings := c.client.processSettings()
	req.Umask = settings.umask
	if o.Umask != nil {
		// umask(2) keeps the permission bits only.
		umask := *o.Umask & 0o777
		req.Umask = &umask
	}
	if len(o.Rlimits) == 0 {
		req.Rlimits, req.rlimitsEncoded = settings.rlimits, settings.rlimitsEncoded
	} else {
		limits, err := mergeRlimits(settings.rlimits, o.Rlimits)
		if err != nil {
			return err
		}
		req.Rlimits = limits
	}
	req.IgnoredSignals = settings.ignoredSignals
	req.Nice = settings.nice
	req.CPUAffinity = settings.cpuAffinity
	req.OomScoreAdj = settings.oomScoreAdj
	req.NewSession = o.Setsid
	if o.Setpgid {
		if o.Pgid < 0 || o.Pgid > math.MaxInt32 {
			return invalid("Pgid %d is not a process group id (0 to %d)", o.Pgid, math.MaxInt32)
		}
		pg := int32(o.Pgid)
		req.ProcessGroup = &pg
	}
	if o.Template != nil && o.Credential != nil {
		return errTemplateRefuses(c.Path, "a Credential")
	}
	if o.Template != nil && o.Sandbox != nil {
		return errTemplateRefuses(c.Path, "a Sandbox")
	}
	if o.Credential != nil {
		req.User = &userSpec{UID: o.Credential.Uid, GID: o.Credential.Gid, Groups: append([]uint32{}, o.Credential.Groups...)}
	}
	if o.KillOnClose != 0 {
		if o.KillOnClose < 1 || o.KillOnClose > maxSignal {
			return invalid("KillOnClose %d is not a signal (1 to %d)", int(o.KillOnClose), int(maxSignal))
		}
		req.KillOnClose = &killOnClose{Signal: int32(o.KillOnClose), ProcessGroup: o.KillProcessGroup}
	}
	timeout, err := o.timeoutSpec()
	if err != nil {
		return err
	}
	req.Timeout = timeout
	if o.Cgroup != nil {
		req.Cgroup = o.Cgroup.spec()
	}
	if o.Sandbox != nil {
		if req.Sandbox, err = o.Sandbox.spec(); err != nil {
			return err
		}
	}
	return nil
}

// maxSignal is SIGRTMAX on Linux.
const maxSignal = syscall.Signal(64)

// invalid is an option refused before sending, as the call it stands for
// would refuse it: errors.Is(err, syscall.EINVAL) holds.
func invalid(format string, args ...any) error {
	return fmt.Errorf("zygote: "+format+": %w", append(args, syscall.EINVAL)...)
}

// timeoutSpec is the request's timeout: none for a zero (or negative)
// Timeout; a negative TimeoutGrace is refused.
func (o *Options) timeoutSpec() (*timeoutSpec, error) {
	if o.Timeout <= 0 {
		return nil, nil
	}
	if o.TimeoutGrace < 0 {
		return nil, invalid("TimeoutGrace %v is negative", o.TimeoutGrace)
	}
	grace := o.TimeoutGrace
	if grace == 0 {
		grace = defaultTimeoutGrace
	}
	return &timeoutSpec{Millis: uint64(max(o.Timeout.Milliseconds(), 1)), GraceMillis: uint64(grace.Milliseconds())}, nil
}

// localPipe turns a piped stream into a pipe made here, for a request
// with defer_spawned, which may not ask the daemon for pipes: the child's
// end is attached (and closed once sent), ours is bridged, and Wait
// closes it after the child exits. stdin says which end is the child's.
func (c *Cmd) localPipe(s *stream, att *attachment, stdin bool) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	child, ours := w, r
	if stdin {
		child, ours = r, w
	}
	c.childFiles = append(c.childFiles, child)
	c.parentIO = append(c.parentIO, ours)
	idx, err := att.add(child)
	if err != nil {
		return err
	}
	s.spec = stdioSpec{Kind: stdioFd, Fd: idx}
	s.piped, s.local = false, ours
	return nil
}

// interfaceEqual is a == b without panicking on uncomparable dynamic types.
func interfaceEqual(a, b any) (eq bool) {
	defer func() {
		if recover() != nil {
			eq = false
		}
	}()
	return a == b
}

// mergeRlimits is this process's limits with set on top, each checked
// as setrlimit(2) checks it (a known resource, soft at most hard).
func mergeRlimits(own []resourceLimit, set []Rlimit) ([]resourceLimit, error) {
	for _, s := range set {
		if s.Resource < 0 || s.Resource >= rlimitCount {
			return nil, invalid("Rlimit resource %d is not an RLIMIT_* number (0 to %d)", s.Resource, rlimitCount-1)
		}
		if s.Cur > s.Max {
			return nil, invalid("Rlimit resource %d: Cur %d is over Max %d", s.Resource, s.Cur, s.Max)
		}
	}
	out := make([]resourceLimit, 0, len(own)+len(set))
	for _, l := range own {
		overridden := false
		for _, s := range set {
			if s.Resource == int(l.Resource) {
				overridden = true
			}
		}
		if !overridden {
			out = append(out, l)
		}
	}
	for _, s := range set {
		out = append(out, resourceLimit{Resource: uint32(s.Resource), Soft: s.Cur, Hard: s.Max})
	}
	return out, nil
}

// cwd is the child's working directory, always absolute.
func (c *Cmd) cwd() (string, error) {
	if filepath.IsAbs(c.Dir) {
		return c.Dir, nil
	}
	// One getcwd(2); os.Getwd also stats "." and $PWD to prefer a
	// logical path, which the child's chdir does not need.
	own, err := rawGetwd()
	if err != nil {
		return "", fmt.Errorf("zygote: reading the current directory (the child starts in it): %w", err)
	}
	if c.Dir == "" {
		return own, nil
	}
	return filepath.Join(own, c.Dir), nil
}

// copyIn feeds the child's stdin; like os/exec it ignores EPIPE, which
// only means the child stopped reading.
func copyIn(end *os.File, r io.Reader) func() error {
	return func() error {
		_, err := io.Copy(end, r)
		if isEPIPE(err) || errors.Is(err, os.ErrClosed) {
			err = nil
		}
		if cerr := end.Close(); err == nil && !isEPIPE(cerr) && !errors.Is(cerr, os.ErrClosed) {
			err = cerr
		}
		return err
	}
}

func isEPIPE(err error) bool {
	return errors.Is(err, syscall.EPIPE)
}

// copyOut drains a child's output pipe into w.
func copyOut(w io.Writer, end *os.File) func() error {
	return func() error {
		_, err := io.Copy(w, end)
		end.Close()
		if errors.Is(err, os.ErrClosed) {
			// WaitDelay closed the pipe; Wait reports ErrWaitDelay.
			err = nil
		}
		return err
	}
}

// Wait waits for the child to exit and its I/O to finish, then releases
// the Cmd's resources. A non-zero exit is an *ExitError. It waits through
// Process.Wait, which may have been called first; when the daemon is lost
// before it reports the exit, the status comes from the child's pidfd
// (see Process.Wait).
func (c *Cmd) Wait() error {
	if c.Process == nil {
		return errNotStarted
	}
	if c.waited {
		return errors.New("exec: Wait was already called")
	}
	c.waited = true

	state, err := c.Process.Wait()
	if err != nil && c.Process.Pid == 0 {
		// A deferred spawn lost before its child was known (see Run).
		err = fmt.Errorf("zygote: waiting for %s: %w", c.Path, err)
	} else if err != nil {
		err = fmt.Errorf("zygote: waiting for %s (pid %d): %w", c.Path, c.Process.Pid, err)
	}
	if state != nil {
		c.ProcessState = state
		if !state.Success() {
			err = &ExitError{ProcessState: state}
		}
	}
	if c.waitDone != nil {
		close(c.waitDone)
	}
	var timer *time.Timer
	if c.ctxResult != nil {
		res := <-c.ctxResult
		timer = res.timer
		if err == nil && res.err != nil {
			err = res.err
		}
	}
	if state == nil {
		// The exit will never be known: stop the copying goroutines
		// rather than wait for a child that may run on.
		closeAll(c.parentIO)
	}
	if gerr := c.awaitGoroutines(timer); err == nil {
		err = gerr
	}
	closeAll(c.parentIO)
	c.Process.release()
	return err
}

func (c *Cmd) awaitGoroutines(timer *time.Timer) error {
	if c.goErr == nil {
		return nil
	}
	defer func() { c.goErr = nil }()
	select {
	case err := <-c.goErr:
		if timer != nil {
			timer.Stop()
		}
		return err
	default:
	}
	if timer == nil {
		if c.WaitDelay == 0 {
			return <-c.goErr
		}
		timer = time.NewTimer(c.WaitDelay)
	}
	select {
	case err := <-c.goErr:
		timer.Stop()
		return err
	case <-timer.C:
		closeAll(c.parentIO)
		<-c.goErr
		return ErrWaitDelay
	}
}

// watchCtx cancels the child when the context is done first, as os/exec
// does: Cancel, then after WaitDelay a kill and closing the pipes.
func (c *Cmd) watchCtx() {
	select {
	case <-c.waitDone:
		c.ctxResult <- ctxResult{}
		return
	case <-c.ctx.Done():
	}
	var err error
	if c.Cancel != nil {
		if cancelErr := c.Cancel(); cancelErr == nil {
			// From here on the child's behaviour may be the context's doing.
			err = c.ctx.Err()
		} else if !errors.Is(cancelErr, os.ErrProcessDone) {
			err = fmt.Errorf("exec: canceling Cmd: %w", cancelErr)
		}
	}
	if c.WaitDelay == 0 {
		c.ctxResult <- ctxResult{err: err}
		return
	}
	timer := time.NewTimer(c.WaitDelay)
	select {
	case <-c.waitDone:
		c.ctxResult <- ctxResult{err: err, timer: timer}
		return
	case <-timer.C:
	}
	if killErr := c.Process.Kill(); killErr != nil && !errors.Is(killErr, os.ErrProcessDone) && err == nil {
		err = fmt.Errorf("exec: killing Cmd: %w", killErr)
	}
	<-c.waitDone
	// The delay is used up: Wait closes the pipes if I/O is still going.
	c.ctxResult <- ctxResult{err: err, timer: time.NewTimer(0)}
}
