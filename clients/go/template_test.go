package zygote

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestTemplateCodec encodes the version-4 messages and decodes them back,
// checks one frame byte for byte, and checks that a connection of
// version 3 neither sends nor accepts them.
func TestTemplateCodec(t *testing.T) {
	clients := []*clientMessage{
		{Template: &templateRequest{ID: 1, Kind: "python", Interpreter: bstr("py"), Preload: []string{"a"},
			Env: []envVar{}, Cwd: nil}},
		{Template: &templateRequest{ID: 300, Kind: "python", Interpreter: bstr("/usr/bin/python3"),
			Preload: []string{"json", "email.mime"}, Env: []envVar{{bstr("K"), bstr("V")}}, Cwd: optBytes("/tmp")}},
		{ListTemplates: &templateListRequest{ID: 9}},
	}
	spawn := spawnRequest{ID: 5, Program: bstr{}, Args: []bstr{bstr("-c"), bstr("pass")}, Env: []envVar{},
		Cwd: optBytes("/"), FdMappings: []fdMapping{}, Rlimits: []resourceLimit{}, CPUAffinity: []uint32{},
		Stdout: stdioSpec{Kind: stdioPipe}}
	clients = append(clients, &clientMessage{SpawnFromTemplate: &templateSpawnRequest{Template: 7, Spawn: spawn}})
	for _, m := range clients {
		frame, err := encodeClientTo(nil, m, templatesSince)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeClientIn(frame, templatesSince)
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Errorf("%x decodes to %+v, %v; want %+v", frame, back, err, m)
		}
		if _, err := encodeClientTo(nil, m, 3); err == nil || !strings.Contains(err.Error(), "protocol version 4") {
			t.Errorf("encoding %+v for version 3: %v, want a refusal", m, err)
		}
	}
	frame, _ := encodeClientTo(nil, clients[0], templatesSince)
	if got, want := hex.EncodeToString(frame), "0501"+"06"+hex.EncodeToString([]byte("python"))+"027079"+"010161"+"00"+"00"; got != want {
		t.Errorf("TemplateRequest frame %s, want %s", got, want)
	}

	servers := []*serverMessage{
		{TemplateReady: &templateReady{ID: 1, Template: 2, Pid: 1234, Reused: true}},
		{Templates: &templateList{ID: 3, Templates: []templateInfo{{Template: 2, UID: 1000, Pid: 77, Kind: "python",
			Interpreter: bstr("python3"), Preload: []string{"json"}, Forks: 5, Restarts: 1, AgeMillis: 60000,
			RssBytes: 1 << 24}}}},
		{SpawnFailed: &spawnFailed{ID: 4, Stage: 20, Errno: int32(syscall.EPROTO), Message: "the template crashed"}},
	}
	for _, m := range servers {
		frame, err := encodeServerIn(m, templatesSince)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeServerIn(frame, templatesSince)
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Errorf("%x decodes to %+v, %v; want %+v", frame, back, err, m)
		}
		if back, err := decodeServerIn(frame, 3); err == nil {
			t.Errorf("%x decodes in version 3 as %+v, want an error", frame, back)
		}
	}
	if got := spawnStage(20).String(); got != "Template" {
		t.Errorf("stage 20 is %q, want Template", got)
	}
}

// TestTemplateOptionsChecked refuses, before anything is sent, each
// option the daemon would refuse or its wire type cannot carry.
func TestTemplateOptionsChecked(t *testing.T) {
	long := strings.Repeat("a", maxPreloadLength+1)
	many := make([]string, maxPreloads+1)
	for i := range many {
		many[i] = "m"
	}
	for _, tc := range []struct {
		name string
		opts TemplateOptions
	}{
		{"empty preload", TemplateOptions{Preload: []string{""}}},
		{"leading digit", TemplateOptions{Preload: []string{"1json"}}},
		{"empty part", TemplateOptions{Preload: []string{"email..mime"}}},
		{"trailing dot", TemplateOptions{Preload: []string{"email."}}},
		{"dash", TemplateOptions{Preload: []string{"a-b"}}},
		{"non-ASCII", TemplateOptions{Preload: []string{"é"}}},
		{"space", TemplateOptions{Preload: []string{"os sys"}}},
		{"too long", TemplateOptions{Preload: []string{long}}},
		{"too many", TemplateOptions{Preload: many}},
		{"NUL in Python", TemplateOptions{Python: "py\x00thon"}},
		{"NUL in Env", TemplateOptions{Env: []string{"A=\x00"}}},
		{"NUL in Dir", TemplateOptions{Dir: "/tmp/\x00"}},
	} {
		if _, err := tc.opts.request(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v, want EINVAL", tc.name, err)
		}
	}
	r, err := (&TemplateOptions{Preload: []string{"json", "email.mime.text", "_x1", long[1:]}, Env: []string{"A=1", "A=2"},
		Dir: "/tmp"}).request()
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Interpreter) != "python3" || r.Kind != "python" || string(r.Cwd) != "/tmp" || len(r.Preload) != 4 {
		t.Errorf("request %+v", r)
	}
	if len(r.Env) != 1 || string(r.Env[0].Value) != "2" {
		t.Errorf("env %+v, want A=2 alone (the last wins)", r.Env)
	}
	if len(many[:maxPreloads]) == maxPreloads {
		if _, err := (&TemplateOptions{Preload: many[:maxPreloads]}).request(); err != nil {
			t.Errorf("%d preloads: %v", maxPreloads, err)
		}
	}
}

// templatePeer is a fake daemon of version 4 offering features, which
// records the messages it gets. It answers a Template with a new handle
// each time, and a SpawnFromTemplate with spawnReply's frame.
type templatePeer struct {
	mu       sync.Mutex
	messages []*clientMessage
	handles  uint64
	spawns   int
}

func (p *templatePeer) start(t *testing.T, version uint32, features []string, spawnReply func(n int, id uint64) []byte) string {
	return scriptedPeer(t, func(_ *net.UnixConn, frame []byte) [][]byte {
		m, err := decodeClientIn(frame, version)
		if err != nil {
			t.Errorf("the fake daemon got a bad frame %x: %v", frame, err)
			return [][]byte{nil}
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.messages = append(p.messages, m)
		var reply *serverMessage
		switch {
		case m.Hello != nil:
			return [][]byte{helloAckIn(version, features...)}
		case m.Template != nil:
			p.handles++
			reply = &serverMessage{TemplateReady: &templateReady{ID: m.Template.ID, Template: p.handles, Pid: 99}}
		case m.SpawnFromTemplate != nil && spawnReply == nil:
			t.Errorf("the fake daemon got a spawn from template %d it was not to get", m.SpawnFromTemplate.Template)
			return [][]byte{nil}
		case m.SpawnFromTemplate != nil:
			p.spawns++
			return [][]byte{spawnReply(p.spawns, m.SpawnFromTemplate.Spawn.ID)}
		case m.ListTemplates != nil:
			reply = &serverMessage{Templates: &templateList{ID: m.ListTemplates.ID, Templates: []templateInfo{{Template: 4,
				UID: 1, Pid: 99, Kind: "python", Interpreter: bstr("python3"), Preload: []string{"json"}, AgeMillis: 1500}}}}
		default:
			return [][]byte{nil}
		}
		b, _ := encodeServerIn(reply, version)
		return [][]byte{b}
	})
}

func (p *templatePeer) sent() []*clientMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*clientMessage{}, p.messages...)
}

func spawnFailedFrame(id uint64, stage string, errno syscall.Errno, message string) []byte {
	i, _ := unitVariant([]byte(`"`+stage+`"`), stageNames[:], "SpawnStage")
	b, _ := encodeServerIn(&serverMessage{SpawnFailed: &spawnFailed{ID: id, Stage: spawnStage(i), Errno: int32(errno),
		Message: message}}, templatesSince)
	return b
}

// TestTemplateRefusedWithoutFeature checks that a template, its list and
// a spawn from it are refused without being sent to a daemon that does
// not offer templates, naming the feature, and that the connection
// still serves.
func TestTemplateRefusedWithoutFeature(t *testing.T) {
	for _, v := range []uint32{3, 4} {
		peer := &templatePeer{}
		path := peer.start(t, v, []string{"pty"}, nil)
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.PythonTemplate(context.Background(), TemplateOptions{Preload: []string{"json"}})
		var te *TemplateError
		if !errors.As(err, &te) || te.Errno != syscall.EOPNOTSUPP || !strings.Contains(te.Message, "feature templates") {
			t.Errorf("version %d: PythonTemplate: %v, want EOPNOTSUPP naming the feature templates", v, err)
		}
		if _, err := c.Templates(context.Background()); !errors.Is(err, syscall.EOPNOTSUPP) || !strings.Contains(err.Error(), "feature templates") {
			t.Errorf("version %d: Templates: %v, want EOPNOTSUPP naming the feature templates", v, err)
		}
		// A Template whose Client reconnected to such a daemon: the spawn
		// asks for the template again, which is refused the same way.
		tmpl := &Template{client: c, spec: templateRequest{Kind: "python", Interpreter: bstr("python3")}}
		err = tmpl.Command("-c", "pass").Run()
		if !errors.As(err, &te) || te.Errno != syscall.EOPNOTSUPP {
			t.Errorf("version %d: spawn: %v, want EOPNOTSUPP", v, err)
		}
		if _, err := c.Status(); err == nil {
			t.Errorf("version %d: the fake daemon answered a status it does not know", v)
		}
		if got := peer.sent(); len(got) != 2 || got[0].Hello == nil || got[1].Status == nil {
			t.Errorf("version %d: the daemon got %d messages, want the Hello and the Status alone", v, len(got))
		}
	}
}

// TestTemplateSpawnRecreatesOnce checks the rule for a template that is
// gone: the Template asks for it again once and retries the spawn once
// with the new handle, passing any other failure on, and never loops.
func TestTemplateSpawnRecreatesOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		replies   []string // the stage of each SpawnFromTemplate's failure
		errno     syscall.Errno
		wantStage string
		spawns    int
	}{
		{"gone, then another failure", []string{"Validate", "Chdir"}, syscall.ENOENT, "Chdir", 2},
		{"gone twice", []string{"Validate", "Validate"}, syscall.ENOENT, "Validate", 2},
		{"another failure first", []string{"Chdir"}, syscall.ENOENT, "Chdir", 1},
		{"another uid's template", []string{"Validate"}, syscall.EPERM, "Validate", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := &templatePeer{}
			path := peer.start(t, templatesSince, []string{"templates"}, func(n int, id uint64) []byte {
				return spawnFailedFrame(id, tc.replies[min(n, len(tc.replies))-1], tc.errno, "refused")
			})
			c, err := Dial(path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tmpl, err := c.PythonTemplate(context.Background(), TemplateOptions{Preload: []string{"json"}})
			if err != nil || tmpl.Handle() != 1 || tmpl.Pid() != 99 {
				t.Fatalf("PythonTemplate: %v, %v", tmpl, err)
			}
			cmd := tmpl.Command("-c", "print(1)")
			cmd.Env = []string{"A=1"}
			err = cmd.Run()
			var se *StartError
			if !errors.As(err, &se) || se.Stage != tc.wantStage || se.Errno != tc.errno {
				t.Fatalf("Run: %v, want %v at %s", err, tc.errno, tc.wantStage)
			}
			var templates, spawns []uint64
			for _, m := range peer.sent() {
				if m.Template != nil {
					templates = append(templates, m.Template.ID)
				}
				if f := m.SpawnFromTemplate; f != nil {
					spawns = append(spawns, f.Template)
					s := f.Spawn
					if len(s.Program) != 0 || s.Argv0 != nil || s.User != nil || s.Sandbox != nil || s.DeferSpawned ||
						len(s.Args) != 2 || string(s.Args[0]) != "-c" || string(s.Args[1]) != "print(1)" ||
						len(s.Env) != 1 || string(s.Env[0].Key) != "A" {
						t.Errorf("the spawn request %+v", s)
					}
				}
			}
			wantSpawns := []uint64{1, 2}[:tc.spawns]
			if len(templates) != tc.spawns || !reflect.DeepEqual(spawns, wantSpawns) {
				t.Errorf("the daemon got %d template requests and spawns from %v, want %d and %v",
					len(templates), spawns, tc.spawns, wantSpawns)
			}
		})
	}
}

// TestTemplateCmdChecked refuses, before sending, what a child of a
// template cannot be: one with a Credential or a Sandbox, arguments that
// are not Python's, or a Cmd of another Client.
func TestTemplateCmdChecked(t *testing.T) {
	peer := &templatePeer{}
	path := peer.start(t, templatesSince, []string{"templates", "sandbox"}, func(_ int, id uint64) []byte {
		return spawnFailedFrame(id, "Chdir", syscall.ENOENT, "no")
	})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tmpl, err := c.PythonTemplate(context.Background(), TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var se *StartError
	cmd := tmpl.Command("-c", "pass")
	cmd.Zygote.Credential = &Credential{Uid: 1}
	if err := cmd.Run(); !errors.As(err, &se) || se.Errno != syscall.EOPNOTSUPP || !strings.Contains(se.Message, "Credential") {
		t.Errorf("with a Credential: %v, want EOPNOTSUPP naming it", err)
	}
	cmd = tmpl.Command("-c", "pass")
	cmd.Zygote.Sandbox = &Sandbox{Network: NetworkNone}
	if err := cmd.Run(); !errors.As(err, &se) || se.Errno != syscall.EOPNOTSUPP || !strings.Contains(se.Message, "Sandbox") {
		t.Errorf("with a Sandbox: %v, want EOPNOTSUPP naming it", err)
	}
	for _, args := range [][]string{{}, {"-c"}, {"-m"}, {"-x", "y"}, {""}, {"-"}} {
		if err := tmpl.Command(args...).Run(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("arguments %q: %v, want EINVAL", args, err)
		}
	}
	other := &Cmd{Args: []string{"python", "-c", "pass"}, Zygote: Options{Template: tmpl}, client: &Client{}}
	if err := other.Run(); !errors.Is(err, errTemplateClient) {
		t.Errorf("another Client's Cmd: %v", err)
	}
	if got := peer.sent(); len(got) != 2 {
		t.Errorf("the daemon got %d messages, want the Hello and the Template alone", len(got))
	}
	// A Cmd literal with the Template spawns through its Client, in order.
	lit := &Cmd{Args: []string{"py", "script.py", "x"}, Zygote: Options{Template: tmpl}}
	if err := lit.Run(); !errors.As(err, &se) || se.Stage != "Chdir" || lit.Path != "python3" {
		t.Errorf("a Cmd literal: %v (Path %q), want the daemon's Chdir failure", err, lit.Path)
	}
	list, err := c.Templates(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != 4 || list[0].Python != "python3" || list[0].Age.Milliseconds() != 1500 {
		t.Errorf("Templates: %+v, %v", list, err)
	}
}

// TestTemplateAskedAgainAfterReconnect checks that a Template whose
// Client reconnected asks for the template again before it spawns: a
// zygote that restarted knows none of the old one's handles, and could
// have given the same number to another template.
func TestTemplateAskedAgainAfterReconnect(t *testing.T) {
	peer := &templatePeer{}
	path := peer.start(t, templatesSince, []string{"templates"}, func(_ int, id uint64) []byte {
		return spawnFailedFrame(id, "Chdir", syscall.ENOENT, "no")
	})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tmpl, err := c.PythonTemplate(context.Background(), TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The fake daemon ends the connection on a status request.
	if _, err := c.Status(); err == nil {
		t.Fatal("the fake daemon answered a status request")
	}
	var se *StartError
	if err := tmpl.Command("-c", "pass").Run(); !errors.As(err, &se) || se.Stage != "Chdir" {
		t.Fatalf("a spawn after the reconnect: %v, want the fake daemon's Chdir failure", err)
	}
	var order []string
	for _, m := range peer.sent() {
		switch {
		case m.Hello != nil:
			order = append(order, "hello")
		case m.Template != nil:
			order = append(order, "template")
		case m.SpawnFromTemplate != nil:
			order = append(order, fmt.Sprintf("spawn from %d", m.SpawnFromTemplate.Template))
		}
	}
	if got, want := strings.Join(order, ", "), "hello, template, hello, template, spawn from 2"; got != want {
		t.Fatalf("the daemon got %s; want %s", got, want)
	}
}
