package zygote

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// featureTemplates is the HelloAck feature of a daemon that runs warm
// templates (protocol version 4 on).
const featureTemplates = "templates"

// Limits on a template's preload list, as the daemon checks them.
const (
	maxPreloads      = 256
	maxPreloadLength = 256
)

// defaultPython is the interpreter of a TemplateOptions without Python.
const defaultPython = "python3"

// TemplateOptions describe a warm Python template: an interpreter the
// zygote starts once, as this program's user, which imports Preload and
// then forks a child per command instead of starting a new interpreter.
type TemplateOptions struct {
	// Preload names the modules imported, in this order, before the
	// template is ready: dotted Python names such as "json" or
	// "email.mime.text", at most 256 of at most 256 bytes each.
	Preload []string
	// Python is the interpreter: a path, or a name the zygote looks up
	// in the PATH of Env (default "python3").
	Python string
	// Env is the template's whole environment while it imports, as
	// "key=value" strings; nil means this process's. Each child gets its
	// own Cmd's environment.
	Env []string
	// Dir is the template's working directory while it imports; ""
	// means this process's. Each child gets its own Cmd's Dir.
	Dir string
}

// Template is a warm Python template of the zygote, made by
// Client.PythonTemplate. Its children are forks of an interpreter that has
// imported the preloads: Command gives a Cmd that starts one, with
// everything a Cmd of Client.Command has except a Credential and a
// Sandbox. It is safe for use by any number of goroutines.
//
// The zygote owns the template process: it is shared by every request of
// this user with the same interpreter, preloads, environment and
// directory, recycled after many forks or a long time, and stopped when
// idle or when this user's last connection closes. When a spawn finds it
// gone, the Template asks for it again, once, and retries the spawn once.
type Template struct {
	client *Client
	spec   templateRequest // ID unset; the same for every (re)request

	mu     sync.Mutex
	conn   *connection // the connection its handle was last confirmed on
	handle uint64
	pid    int
	reused bool
}

// TemplateError is a template the zygote could not find or start: the
// interpreter could not be run (ENOENT, EACCES, ...), a preload raised
// (Message has the traceback) or started a thread, the template did not
// get ready in time (ETIMEDOUT), there are too many (EAGAIN), or the
// zygote does not offer templates (EOPNOTSUPP). errors.Is matches Errno.
type TemplateError struct {
	// Python and Preload are the template's, as asked for.
	Python  string
	Preload []string
	// Errno is the error number.
	Errno syscall.Errno
	// Message is the zygote's explanation.
	Message string
}

func (e *TemplateError) Error() string {
	return fmt.Sprintf("zygote: python template of %s (preload %s): %s (%v)", e.Python,
		strings.Join(e.Preload, ","), e.Message, e.Errno)
}

// Unwrap gives the errno.
func (e *TemplateError) Unwrap() error { return e.Errno }

// PythonTemplate finds or starts a warm Python template with opts and
// returns once it is ready: after its preloads were imported, which may
// take as long as they take to import (the zygote gives up after its
// start deadline, 60 s by default). ctx bounds the wait; the template
// the zygote started anyway is stopped when idle.
//
// Each option is checked before anything is sent: a bad preload name, an
// empty or NUL-containing path fails with an error satisfying
// errors.Is(err, syscall.EINVAL). A zygote that does not offer templates
// is not asked: the *TemplateError has EOPNOTSUPP and names the feature.
func (c *Client) PythonTemplate(ctx context.Context, opts TemplateOptions) (*Template, error) {
	spec, err := opts.request()
	if err != nil {
		return nil, err
	}
	t := &Template{client: c, spec: *spec}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.requestLocked(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// request checks the options against what the daemon accepts and their
// wire types, and turns them into the request (without its id).
func (o *TemplateOptions) request() (*templateRequest, error) {
	python := o.Python
	if python == "" {
		python = defaultPython
	}
	if strings.IndexByte(python, 0) >= 0 {
		return nil, invalid("Python %q contains a NUL byte", python)
	}
	if len(o.Preload) > maxPreloads {
		return nil, invalid("%d preloads, over the limit of %d", len(o.Preload), maxPreloads)
	}
	for _, name := range o.Preload {
		if err := checkModuleName(name); err != nil {
			return nil, err
		}
	}
	own := &Cmd{Env: o.Env, Dir: o.Dir}
	env, err := own.environ()
	if err != nil {
		return nil, invalid("%v", err)
	}
	dir, err := own.cwd()
	if err != nil {
		return nil, err
	}
	if strings.IndexByte(dir, 0) >= 0 {
		return nil, invalid("Dir %q contains a NUL byte", dir)
	}
	r := &templateRequest{Kind: pythonTemplate, Interpreter: bstr(python), Preload: slices.Clone(o.Preload),
		Env: make([]envVar, 0, len(env)), Cwd: optBytes(dir)}
	for _, kv := range env {
		i := envKeyEnd(kv)
		r.Env = append(r.Env, envVar{Key: bstr(kv[:i]), Value: bstr(kv[i+1:])})
	}
	return r, nil
}

// checkModuleName checks a preload: a dotted Python identifier of ASCII
// letters, digits and underscores, at most maxPreloadLength bytes.
func checkModuleName(name string) error {
	if len(name) > maxPreloadLength {
		return invalid("preload %.40q... is %d bytes, over the limit of %d", name, len(name), maxPreloadLength)
	}
	for _, part := range strings.Split(name, ".") {
		ok := part != "" && !('0' <= part[0] && part[0] <= '9')
		for i := 0; ok && i < len(part); i++ {
			ch := part[i]
			ok = ch == '_' || 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9'
		}
		if !ok {
			return invalid("preload %q is not a module name (dotted identifiers of A-Z, a-z, 0-9 and _)", name)
		}
	}
	return nil
}

// requestLocked sends the template's request and records the reply.
func (t *Template) requestLocked(ctx context.Context) error {
	m, conn, err := t.client.roundTripContext(ctx, func(id uint64) *clientMessage {
		r := t.spec
		r.ID = id
		return &clientMessage{Template: &r}
	})
	if err != nil {
		return err
	}
	switch {
	case m.TemplateReady != nil:
		t.conn, t.handle, t.pid, t.reused = conn, m.TemplateReady.Template, int(m.TemplateReady.Pid), m.TemplateReady.Reused
		return nil
	case m.RequestFailed != nil:
		return t.failure(syscall.Errno(m.RequestFailed.Errno), m.RequestFailed.Message)
	default:
		return &ProtocolError{Expected: "TemplateReady or RequestFailed", Got: m.name()}
	}
}

func (t *Template) failure(errno syscall.Errno, message string) *TemplateError {
	return &TemplateError{Python: string(t.spec.Interpreter), Preload: slices.Clone(t.spec.Preload), Errno: errno,
		Message: message}
}

// current is the handle to spawn from: the one known, unless the Client
// has reconnected since it was confirmed, when the template is asked for
// again (a restarted zygote knows no handle of the old one's, and could
// give the same number to another template).
func (t *Template) current(ctx context.Context) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == t.client.cur.Load() && !t.conn.finished() {
		return t.handle, nil
	}
	if err := t.requestLocked(ctx); err != nil {
		return 0, err
	}
	return t.handle, nil
}

// renew asks for the template again after a spawn found handle gone,
// unless another goroutine already did.
func (t *Template) renew(ctx context.Context, stale uint64) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.handle != stale {
		return t.handle, nil
	}
	if err := t.requestLocked(ctx); err != nil {
		return 0, err
	}
	return t.handle, nil
}

// Pid is the template process's pid, as the zygote last reported it.
func (t *Template) Pid() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pid
}

// Reused reports whether the zygote's latest answer found the template
// already running (started by an earlier request of this user) rather
// than starting it.
func (t *Template) Reused() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reused
}

// Handle is the zygote's number for the template, as in TemplateInfo.ID.
func (t *Template) Handle() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.handle
}

// Python is the template's interpreter, as asked for.
func (t *Template) Python() string { return string(t.spec.Interpreter) }

// Preload is the template's preload list.
func (t *Template) Preload() []string { return slices.Clone(t.spec.Preload) }

// Command returns a Cmd that runs a child of the template with arg as
// its Python arguments: what would follow "python" on a command line,
// beginning with "-c", CODE; "-m", MODULE; or a script path. The child
// runs as `python ARGS` would (sys.argv, __main__, the exit status).
//
// The Cmd is the usual one (Run, Output, Start, Wait, the pipes,
// Process, Env, Dir, Stdin...), with Path the interpreter, Args[0] the
// interpreter and Zygote.Template t. Setting Zygote.Template on any Cmd
// does the same: Path and Args[0] then only name the command in errors
// and String, and Args[1:] are the Python arguments.
func (t *Template) Command(arg ...string) *Cmd {
	python := t.Python()
	return &Cmd{Path: python, Args: append([]string{python}, arg...), Zygote: Options{Template: t},
		client: t.client}
}

// CommandContext is Command with a context, as Client.CommandContext.
func (t *Template) CommandContext(ctx context.Context, arg ...string) *Cmd {
	if ctx == nil {
		panic("nil Context")
	}
	cmd := t.Command(arg...)
	cmd.ctx = ctx
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	return cmd
}

// TemplateInfo is one template in the zygote's list (Client.Templates).
type TemplateInfo struct {
	// ID is its handle, as in Template.Handle.
	ID uint64
	// UID is the user it runs as and belongs to.
	UID uint32
	// Pid is its process's pid; 0 while none runs (between a recycle or
	// a crash and the next request).
	Pid int
	// Kind is its runtime ("python").
	Kind string
	// Python is the interpreter, as asked for, and Preload its modules.
	Python  string
	Preload []string
	// Forks counts the children its current process forked, Restarts the
	// times it was started again (recycled, or after a crash).
	Forks    uint64
	Restarts uint64
	// Age is its current process's age, RSS its resident memory in bytes.
	Age time.Duration
	RSS uint64
}

// Templates lists the zygote's templates this program may see: its
// user's (root sees every user's). A zygote that does not offer templates
// is not asked: the error satisfies errors.Is(err, syscall.EOPNOTSUPP).
func (c *Client) Templates(ctx context.Context) ([]TemplateInfo, error) {
	m, _, err := c.roundTripContext(ctx, func(id uint64) *clientMessage {
		return &clientMessage{ListTemplates: &templateListRequest{ID: id}}
	})
	if err != nil {
		return nil, err
	}
	switch {
	case m.Templates != nil:
		out := make([]TemplateInfo, 0, len(m.Templates.Templates))
		for _, i := range m.Templates.Templates {
			out = append(out, TemplateInfo{ID: i.Template, UID: i.UID, Pid: int(i.Pid), Kind: i.Kind,
				Python: string(i.Interpreter), Preload: i.Preload, Forks: i.Forks, Restarts: i.Restarts,
				Age: time.Duration(i.AgeMillis) * time.Millisecond, RSS: i.RssBytes})
		}
		return out, nil
	case m.RequestFailed != nil:
		return nil, fmt.Errorf("zygote: listing templates: %s: %w", m.RequestFailed.Message, syscall.Errno(m.RequestFailed.Errno))
	default:
		return nil, &ProtocolError{Expected: "Templates or RequestFailed", Got: m.name()}
	}
}

// roundTripContext is roundTrip bounded by ctx, which also returns the
// connection that carried the request. A reply that comes after ctx is
// done is read and dropped.
func (c *Client) roundTripContext(ctx context.Context, build func(id uint64) *clientMessage) (*serverMessage, *connection, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	conn, p, err := c.request(false, false, build, nil)
	if err != nil {
		return nil, nil, err
	}
	if ctx.Done() == nil {
		m, err := conn.reply(p)
		return m, conn, err
	}
	type result struct {
		m   *serverMessage
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := conn.reply(p)
		done <- result{m, err}
	}()
	select {
	case r := <-done:
		return r.m, conn, r.err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}
