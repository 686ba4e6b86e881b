package zygote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
)

// helloAckIn is a HelloAck frame in the layout of protocol version v.
func helloAckIn(v uint32, features ...string) []byte {
	b, _ := encodeServer(&serverMessage{HelloAck: &helloAck{ProtocolVersion: v, ServerVersion: "test",
		Limits: limits{MaxFrameBytes: 262144, MaxFdsPerFrame: 64}, Features: features}})
	return b
}

// TestHandshakeNegotiates checks that the client says its newest version,
// reads a HelloAck in the layout of the version the daemon picked, and
// refuses a version it did not offer.
func TestHandshakeNegotiates(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ack      []byte
		version  uint32
		features []string
		refused  string
	}{
		{"version 4 with templates", helloAckIn(4, "pty", "sandbox", "templates"), 4, []string{"pty", "sandbox", "templates"}, ""},
		{"version 3 with features", helloAckIn(3, "pty", "sandbox"), 3, []string{"pty", "sandbox"}, ""},
		{"version 2 with features", helloAckIn(2, "pty", "teleport"), 2, []string{"pty", "teleport"}, ""},
		{"version 1, no features", helloAckIn(1), 1, nil, ""},
		{"a version the client did not offer", helloAckIn(protocolVersion + 1), 0, nil, fmt.Sprintf("HelloAck for version %d", protocolVersion+1)},
		{"version 0", helloAckIn(0), 0, nil, "HelloAck for version 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := make(chan uint32, 1)
			path := scriptedPeer(t, func(_ *net.UnixConn, frame []byte) [][]byte {
				m, err := decodeClient(frame)
				if err == nil && m.Hello != nil {
					sent <- m.Hello.ProtocolVersion
				}
				return [][]byte{tc.ack}
			})
			c, err := Dial(path)
			if got := <-sent; got != protocolVersion {
				t.Errorf("Hello says version %d, want %d", got, protocolVersion)
			}
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("Dial: %v, want an error containing %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer c.Close()
			if c.ProtocolVersion() != tc.version {
				t.Errorf("ProtocolVersion() = %d, want %d", c.ProtocolVersion(), tc.version)
			}
			if strings.Join(c.Features(), ",") != strings.Join(tc.features, ",") {
				t.Errorf("Features() = %q, want %q", c.Features(), tc.features)
			}
			if c.Offers("pty") != (tc.version >= 2) {
				t.Errorf("Offers(pty) = %v", c.Offers("pty"))
			}
		})
	}
}

// TestDaemonWithFewerFeatures runs against a real daemon that withholds
// cgroups, pty, sandbox and templates: the client sees the features
// offered, still spawns, a cgroup request is refused naming the feature,
// and a template is refused before it is sent, naming its feature.
func TestDaemonWithFewerFeatures(t *testing.T) {
	t.Setenv("ZYGOTE_MASK_FEATURES", "cgroups,pty,sandbox,templates")
	d := ownDaemon(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ProtocolVersion() != protocolVersion {
		t.Errorf("ProtocolVersion() = %d, want %d", c.ProtocolVersion(), protocolVersion)
	}
	if c.Offers("cgroups") || c.Offers("pty") || c.Offers("sandbox") || c.Offers("templates") {
		t.Errorf("Features() = %q: withheld or unimplemented features offered", c.Features())
	}
	if !c.Offers("large_args") {
		t.Errorf("Features() = %q: large_args missing", c.Features())
	}
	if err := c.Command("true").Run(); err != nil {
		t.Fatalf("a plain spawn: %v", err)
	}
	cmd := c.Command("true")
	cmd.Zygote.Cgroup = &CgroupOptions{KillTree: true}
	err = cmd.Run()
	var start *StartError
	if !errors.As(err, &start) || start.Errno != syscall.EOPNOTSUPP || !strings.Contains(start.Message, "feature cgroups") {
		t.Fatalf("a cgroup spawn: %v, want EOPNOTSUPP naming the feature cgroups", err)
	}
	if err := c.Command("true").Run(); err != nil {
		t.Fatalf("a spawn after the refusal: %v", err)
	}
	_, err = c.PythonTemplate(context.Background(), TemplateOptions{})
	var te *TemplateError
	if !errors.As(err, &te) || te.Errno != syscall.EOPNOTSUPP || !strings.Contains(te.Message, "feature templates") {
		t.Fatalf("a template: %v, want EOPNOTSUPP naming the feature templates", err)
	}
	if err := c.Command("true").Run(); err != nil {
		t.Fatalf("a spawn after the template's refusal: %v", err)
	}
}

// TestVersion2Daemon talks to a real daemon in version 2, the layouts
// a daemon that knows no newer version answers in: spawns and status
// work without the version-3 fields, and a sandbox is refused before it
// is sent, naming the feature.
func TestVersion2Daemon(t *testing.T) {
	d := ownDaemon(t)
	helloVersion.Store(2)
	defer helloVersion.Store(protocolVersion)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ProtocolVersion() != 2 {
		t.Fatalf("ProtocolVersion() = %d, want 2", c.ProtocolVersion())
	}
	out, err := c.Command("/bin/echo", "two").Output()
	if err != nil || string(out) != "two\n" {
		t.Fatalf("a spawn in version 2: %q, %v", out, err)
	}
	s, err := c.Status()
	if err != nil || s.SpawnsSucceeded == 0 || len(s.Peers) != 0 || len(s.Spawners) != 0 {
		t.Fatalf("status in version 2: %+v, %v", s, err)
	}
	cmd := c.Command("/bin/true")
	cmd.Zygote.Sandbox = &Sandbox{Network: NetworkNone}
	var start *StartError
	if err := cmd.Run(); !errors.As(err, &start) || start.Errno != syscall.EOPNOTSUPP || !strings.Contains(start.Message, "feature sandbox") {
		t.Fatalf("a sandbox in version 2: %v, want EOPNOTSUPP naming the feature sandbox", err)
	}
	if err := c.Command("/bin/true").Run(); err != nil {
		t.Fatalf("a spawn after the refusal: %v", err)
	}
}

// TestVersion3DaemonRefusesTemplates talks to a real daemon in version
// 3, which lists no templates to such a connection: a template is
// refused before it is sent, saying the version, and the connection
// still serves.
func TestVersion3DaemonRefusesTemplates(t *testing.T) {
	d := ownDaemon(t)
	helloVersion.Store(3)
	defer helloVersion.Store(protocolVersion)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ProtocolVersion() != 3 || c.Offers("templates") {
		t.Fatalf("version %d, features %q: want version 3 without templates", c.ProtocolVersion(), c.Features())
	}
	_, err = c.PythonTemplate(context.Background(), TemplateOptions{})
	var te *TemplateError
	if !errors.As(err, &te) || te.Errno != syscall.EOPNOTSUPP || !strings.Contains(te.Message, "protocol version 3; templates need 4") {
		t.Fatalf("a template in version 3: %v, want EOPNOTSUPP saying the version", err)
	}
	if _, err := c.Templates(context.Background()); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("the list in version 3: %v, want EOPNOTSUPP", err)
	}
	if out, err := c.Command("/bin/echo", "three").Output(); err != nil || string(out) != "three\n" {
		t.Fatalf("a spawn after the refusal: %q, %v", out, err)
	}
}
