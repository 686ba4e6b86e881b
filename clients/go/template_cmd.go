package zygote

// The Cmd side of warm templates: what a child of a template may be, and
// its start, retried once when the template is gone.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// refuseTemplates refuses, before anything is sent, a template message
// on a connection whose daemon does not offer templates, as the daemon
// would (a version-3 daemon would close the connection instead).
func (c *connection) refuseTemplates(m *clientMessage) error {
	if (m.Template == nil && m.SpawnFromTemplate == nil && m.ListTemplates == nil) ||
		slices.Contains(c.features, featureTemplates) {
		return nil
	}
	why := fmt.Sprintf("the zygote does not offer the feature %s", featureTemplates)
	if c.protocol < templatesSince {
		why += fmt.Sprintf(" (it speaks protocol version %d; templates need %d)", c.protocol, templatesSince)
	}
	switch {
	case m.Template != nil:
		return &TemplateError{Python: string(m.Template.Interpreter), Preload: slices.Clone(m.Template.Preload),
			Errno: syscall.EOPNOTSUPP, Message: why}
	case m.SpawnFromTemplate != nil:
		return &StartError{Program: "template", Stage: "Validate", Errno: syscall.EOPNOTSUPP,
			Message: why + "; the child was not started"}
	}
	return fmt.Errorf("zygote: listing templates: %s: %w", why, syscall.EOPNOTSUPP)
}

// errTemplateRefuses is a Cmd option a warm child cannot honour.
func errTemplateRefuses(program, option string) error {
	return &StartError{Program: program, Stage: "Validate", Errno: syscall.EOPNOTSUPP,
		Message: "a child of a template cannot have " + option + " (it is a fork of the template, which runs as this user, unconfined); start it with Client.Command instead"}
}

// checkPythonArgs checks a template child's arguments as the zygote
// does: "-c" CODE, "-m" MODULE, or a script path not starting with "-".
func checkPythonArgs(args []string) error {
	switch {
	case len(args) == 0:
		return invalid("a template child needs Python arguments: \"-c\", CODE; \"-m\", MODULE; or a script path")
	case args[0] == "-c" || args[0] == "-m":
		if len(args) < 2 {
			return invalid("%q needs an argument after it", args[0])
		}
	case args[0] == "" || strings.HasPrefix(args[0], "-"):
		return invalid("template child arguments begin with \"-c\", \"-m\" or a script path, not %q", args[0])
	}
	return nil
}

// errTemplateClient is a Cmd whose Client is not its template's.
var errTemplateClient = errors.New("zygote: the Cmd's Client is not its Template's: templates belong to the Client that made them")

// templateClient picks the Client of a Cmd with a template.
func (c *Cmd) templateClient() error {
	t := c.Zygote.Template
	if c.client != nil && c.client != t.client {
		return errTemplateClient
	}
	c.client = t.client
	if c.Path == "" {
		c.Path = t.Python()
	}
	return nil
}

// startFromTemplate starts the child of a Cmd with a template, never
// deferred. A spawn refused because the template is gone (ENOENT at
// Validate: stopped when idle, or a zygote that restarted) asks for the
// template again, once, and is retried once with the same fds.
func (c *Cmd) startFromTemplate(t *Template, p *plan) error {
	ctx := c.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	handle, err := t.current(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		proc, r, err := c.sendFromTemplate(handle, p)
		if err != nil {
			return err
		}
		if f := r.msg.SpawnFailed; f != nil && attempt == 0 && f.Stage.String() == "Validate" &&
			syscall.Errno(f.Errno) == syscall.ENOENT {
			closeFds(r.fds)
			if handle, err = t.renew(ctx, handle); err != nil {
				c.closeChildFiles()
				return err
			}
			continue
		}
		c.closeChildFiles()
		ends, err := c.spawnedFrom(proc, p, r, nil)
		if err != nil {
			return err
		}
		c.Process = proc
		c.startIO(p, ends)
		return nil
	}
}

// sendFromTemplate sends one SpawnFromTemplate for the plan and waits for
// its first reply.
func (c *Cmd) sendFromTemplate(handle uint64, p *plan) (*Process, reply, error) {
	cl := c.client
	conn, pending, err := cl.request(true, false, func(id uint64) *clientMessage {
		p.req.ID = id
		return &clientMessage{SpawnFromTemplate: &templateSpawnRequest{Template: handle, Spawn: *p.req}}
	}, p.att.fds)
	// The frame holds its own references to the fds now.
	runtime.KeepAlive(p.att.files)
	if err != nil {
		return nil, reply{}, err
	}
	proc := &Process{client: cl, conn: conn, spawnID: p.req.ID, pending: pending, pidfd: -1,
		program: c.Path, killTree: c.Zygote.Cgroup != nil && c.Zygote.Cgroup.KillTree}
	r, err := conn.await(pending)
	if err != nil {
		c.closeChildFiles()
		return nil, reply{}, fmt.Errorf("zygote: starting %q: %w", c.Path, err)
	}
	return proc, r, nil
}
