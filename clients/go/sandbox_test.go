package zygote

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// sampleSandbox uses every field but Profile and SeccompFilter.
func sampleSandbox() *Sandbox {
	return &Sandbox{
		Filesystem: &Filesystem{Mounts: []Mount{{Kind: ReadOnlyBind, Source: "/usr", Destination: "/usr"},
			{Kind: Tmpfs, Destination: "/tmp"}}},
		Network:  NetworkNone,
		Isolate:  true,
		Hostname: "h",
		Seccomp:  "default",
		Landlock: &Landlock{ReadWrite: []string{"/w"}, TCPConnect: []uint16{443}, Require: true},
	}
}

// TestSandboxWireLayout checks the encoded sandbox against bytes written
// by hand from the version-3 layout, and that it ends the request.
func TestSandboxWireLayout(t *testing.T) {
	spec, err := sampleSandbox().spec()
	if err != nil {
		t.Fatal(err)
	}
	e := &encoder{}
	e.sandbox(spec)
	want := "01" + // Some(SandboxSpec)
		"00" + // profile: None
		"01" + "02" + "00" + "042f757372" + "042f757372" + "02" + "00" + "042f746d70" + // two mounts
		"01" + // network: None
		"01" + // isolate
		"01" + "0168" + // hostname "h"
		"01" + "00" + "0764656661756c74" + // seccomp Profile("default")
		"01" + "00" + "00" + "01022f77" + "00" + "01bb03" + "01" // landlock
	if got := hex.EncodeToString(e.b); got != want {
		t.Fatalf("sandbox encodes as\n%s\nwant\n%s", got, want)
	}

	req := &spawnRequest{Program: bstr("p"), Sandbox: spec}
	frame, err := encodeClientTo(nil, &clientMessage{Spawn: req}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(frame, e.b) {
		t.Fatalf("the request %x does not end with the sandbox", frame)
	}
	m, err := decodeClientIn(frame, 3)
	if err != nil || !reflect.DeepEqual(m.Spawn.Sandbox, spec) {
		t.Fatalf("decoded sandbox %+v (%v), want %+v", m.Spawn.Sandbox, err, spec)
	}
	// A version-2 frame has no room for it: refused, never dropped.
	if _, err := encodeClientTo(nil, &clientMessage{Spawn: req}, 2); err == nil || !strings.Contains(err.Error(), "protocol version 3") {
		t.Fatalf("a sandbox encoded for version 2: %v, want a refusal", err)
	}
	plain := &spawnRequest{Program: bstr("p")}
	v2, _ := encodeClientTo(nil, &clientMessage{Spawn: plain}, 2)
	v3, _ := encodeClientTo(nil, &clientMessage{Spawn: plain}, 3)
	if !bytes.Equal(append(v2, 0), v3) {
		t.Fatalf("without a sandbox, version 3 is version 2 plus a None tag:\n%x\n%x", v2, v3)
	}
}

// TestSandboxReplyLayouts decodes the version-3 Spawned and StatusReply
// from hand-written bytes, and the version-2 ones without the new fields.
func TestSandboxReplyLayouts(t *testing.T) {
	spawnedV3, _ := hex.DecodeString("01" + "07" + "0a" + // Spawned id 7, pid 5
		"01" + "010462617365" + "02" + "036d6e74" + "03706964" + "00" + "0107" + "01") // sandbox
	m, err := decodeServerIn(spawnedV3, 3)
	if err != nil {
		t.Fatal(err)
	}
	got := newAppliedSandbox(m.Spawned.Sandbox)
	want := &AppliedSandbox{Profile: "base", Namespaces: []string{"mnt", "pid"}, Seccomp: "", LandlockABI: 7, LandlockComplete: true}
	if m.Spawned.Pid != 5 || !reflect.DeepEqual(got, want) {
		t.Fatalf("Spawned %+v, applied %+v; want pid 5, %+v", m.Spawned, got, want)
	}
	if _, err := decodeServerIn(spawnedV3, 2); err == nil {
		t.Fatal("a version-3 Spawned decoded as version 2")
	}
	if m, err := decodeServerIn(spawnedV3[:3], 2); err != nil || m.Spawned.Sandbox != nil {
		t.Fatalf("a version-2 Spawned: %+v, %v", m, err)
	}

	status := &statusReply{ID: 1, ServerVersion: "t", Peers: []peerUse{{UID: 1000, Connections: 2, Children: 3,
		ChildrenLimit: 128, ConnectionsLimit: 16, SandboxProfile: ptr("strict")}},
		Spawners: []spawnerInfo{{UID: 1000, Pid: -1, Spawns: 9, Restarts: 1}}}
	frame, _ := encodeServerIn(&serverMessage{Status: status}, 3)
	tail, _ := hex.DecodeString("01" + "e807" + "02" + "03" + "8001" + "10" + "0106737472696374" + // peers
		"01" + "e807" + "01" + "09" + "01") // spawners
	if !bytes.HasSuffix(frame, tail) {
		t.Fatalf("status %x does not end with %x", frame, tail)
	}
	back, err := decodeServerIn(frame, 3)
	if err != nil || !reflect.DeepEqual(back.Status, status) {
		t.Fatalf("status decoded as %+v (%v), want %+v", back.Status, err, status)
	}
	// The Sandbox stage exists from version 3 on; a version-2 daemon sends Exec.
	failed, _ := hex.DecodeString("02" + "01" + "13" + "02" + "00")
	if m, err := decodeServerIn(failed, 3); err != nil || m.SpawnFailed.Stage.String() != "Sandbox" {
		t.Fatalf("stage 19 at version 3: %+v, %v", m, err)
	}
	if _, err := decodeServerIn(failed, 2); err == nil {
		t.Fatal("stage 19 decoded at version 2")
	}
}

func ptr[T any](v T) *T { return &v }

// TestSandboxFieldsChecked refuses each bad field before anything is
// encoded, with EINVAL and the field's name.
func TestSandboxFieldsChecked(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(s *Sandbox)
	}{
		{"relative source", "Mounts[0].Source \"usr\" is not an absolute path", func(s *Sandbox) { s.Filesystem.Mounts[0].Source = "usr" }},
		{"empty destination", "Mounts[1].Destination is empty", func(s *Sandbox) { s.Filesystem.Mounts[1].Destination = "" }},
		{"NUL in a path", "contains a NUL byte", func(s *Sandbox) { s.Filesystem.Mounts[0].Destination = "/a\x00b" }},
		{"tmpfs with a source", "a Tmpfs mount has no Source", func(s *Sandbox) { s.Filesystem.Mounts[1].Source = "/x" }},
		{"unknown mount kind", "Mounts[0].Kind 3 is not a MountKind", func(s *Sandbox) { s.Filesystem.Mounts[0].Kind = 3 }},
		{"unknown network", "Sandbox.Network 2", func(s *Sandbox) { s.Network = 2 }},
		{"hostname without isolate", "needs Sandbox.Isolate", func(s *Sandbox) { s.Isolate = false }},
		{"NUL in the hostname", "Sandbox.Hostname \"a\\x00\" contains a NUL byte", func(s *Sandbox) { s.Hostname = "a\x00" }},
		{"profile not UTF-8", "Sandbox.Profile \"\\xff\" is not valid UTF-8", func(s *Sandbox) { s.Profile = "\xff" }},
		{"both seccomps", "both set", func(s *Sandbox) { s.SeccompFilter = "deny ptrace" }},
		{"relative landlock path", "Landlock.ReadOnly[1] \"etc\" is not an absolute path", func(s *Sandbox) { s.Landlock.ReadOnly = []string{"/", "etc"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sampleSandbox()
			tc.edit(s)
			cmd := (&Client{}).Command("/bin/true")
			cmd.Zygote.Sandbox = s
			_, err := cmd.build(false)
			if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("build: %v, want EINVAL with %q", err, tc.want)
			}
		})
	}
	cmd := (&Client{}).Command("/bin/true")
	cmd.Zygote.Sandbox = sampleSandbox()
	if _, err := cmd.build(false); err != nil {
		t.Fatalf("the sample sandbox: %v", err)
	}
}

// sandboxPeer is a scripted daemon of version v offering features: it
// counts the spawns it receives, answers one with a sandbox with Spawned
// (carrying applied) and Exited, or with Exited alone when it asked for
// defer_spawned, and any other with SpawnFailed.
func sandboxPeer(t *testing.T, v uint32, applied *appliedSandbox, spawns *atomic.Int32, features ...string) string {
	return scriptedPeer(t, func(conn *net.UnixConn, frame []byte) [][]byte {
		m, err := decodeClientIn(frame, v)
		switch {
		case err != nil:
			t.Errorf("the peer of version %d got a frame it cannot decode: %v", v, err)
			return [][]byte{nil}
		case m.Hello != nil:
			return [][]byte{helloAckIn(v, features...)}
		case m.Spawn == nil:
			return [][]byte{nil}
		}
		spawns.Add(1)
		if m.Spawn.Sandbox == nil {
			b, _ := encodeServerIn(&serverMessage{SpawnFailed: &spawnFailed{ID: m.Spawn.ID, Errno: int32(syscall.EPERM), Message: "no sandbox"}}, v)
			return [][]byte{b}
		}
		code := int32(0)
		exit, _ := encodeServerIn(&serverMessage{Exited: &exitNotice{ID: m.Spawn.ID, Status: exitStatus{Exited: &code}, Pid: 42}}, v)
		if m.Spawn.DeferSpawned {
			// A deferred child that ended at once gets its exit alone.
			return [][]byte{exit}
		}
		pidfd, _, errno := syscall.Syscall(434 /* pidfd_open */, uintptr(os.Getpid()), 0, 0)
		if errno != 0 {
			t.Errorf("pidfd_open: %v", errno)
			return [][]byte{nil}
		}
		b, _ := encodeServerIn(&serverMessage{Spawned: &spawned{ID: m.Spawn.ID, Pid: 42, Sandbox: applied}}, v)
		_, _, err = conn.WriteMsgUnix(b, syscall.UnixRights(int(pidfd)), nil)
		syscall.Close(int(pidfd))
		if err != nil {
			return [][]byte{nil}
		}
		return [][]byte{exit}
	})
}

// TestSandboxNeedsTheFeature: against a daemon of version 3 without the
// feature, and one of version 2, a sandboxed spawn is refused before it
// is sent, with EOPNOTSUPP naming the feature; the connection still
// carries the next spawn.
func TestSandboxNeedsTheFeature(t *testing.T) {
	for _, v := range []uint32{3, 2} {
		var spawns atomic.Int32
		c, err := Dial(sandboxPeer(t, v, nil, &spawns, "pty"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cmd := c.Command("/bin/true")
		cmd.Zygote.Sandbox = &Sandbox{Isolate: true}
		err = cmd.Run()
		var start *StartError
		if !errors.As(err, &start) || start.Errno != syscall.EOPNOTSUPP || start.Stage != "Validate" ||
			!strings.Contains(start.Message, "feature sandbox") {
			t.Fatalf("version %d: a sandboxed spawn: %v, want EOPNOTSUPP naming the feature sandbox", v, err)
		}
		if n := spawns.Load(); n != 0 {
			t.Fatalf("version %d: the refused spawn reached the daemon (%d spawns)", v, n)
		}
		err = c.Command("/bin/true").Run()
		if !errors.As(err, &start) || start.Message != "no sandbox" || spawns.Load() != 1 {
			t.Fatalf("version %d: the spawn after the refusal: %v (%d spawns)", v, err, spawns.Load())
		}
	}
}

// TestSandboxAppliedIsReported: the request carries the sandbox, and
// Process.Sandbox is what the daemon reported, for Start and for Run
// (which does not defer a sandboxed spawn, so that Spawned comes).
func TestSandboxAppliedIsReported(t *testing.T) {
	var spawns atomic.Int32
	applied := &appliedSandbox{Profile: ptr("ci"), Namespaces: []string{"mount", "net"}, Seccomp: ptr("default"),
		LandlockABI: ptr(uint32(7)), LandlockComplete: true}
	c, err := Dial(sandboxPeer(t, 3, applied, &spawns, "sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := &AppliedSandbox{Profile: "ci", Namespaces: []string{"mount", "net"}, Seccomp: "default", LandlockABI: 7, LandlockComplete: true}
	for _, run := range []bool{false, true} {
		cmd := c.Command("/bin/true")
		cmd.Zygote.Sandbox = sampleSandbox()
		if run {
			err = cmd.Run()
		} else if err = cmd.Start(); err == nil {
			err = cmd.Wait()
		}
		if err != nil {
			t.Fatalf("run %v: %v", run, err)
		}
		if !reflect.DeepEqual(cmd.Process.Sandbox, want) {
			t.Fatalf("run %v: Process.Sandbox = %+v, want %+v", run, cmd.Process.Sandbox, want)
		}
	}
}

// TestSandboxAgainstTheDaemon runs against the real daemon, which does not
// offer sandbox until it enforces one: a sandboxed spawn is refused
// before it is sent, naming the feature; bad fields are refused with
// EINVAL; the connection spawns afterwards.
func TestSandboxAgainstTheDaemon(t *testing.T) {
	t.Setenv("ZYGOTE_MASK_FEATURES", featureSandbox)
	d := ownDaemon(t)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Offers(featureSandbox) {
		t.Fatalf("Features() = %q: the withheld sandbox is offered", c.Features())
	}
	cmd := c.Command("/bin/true")
	cmd.Zygote.Sandbox = &Sandbox{Network: NetworkNone}
	var start *StartError
	if err := cmd.Run(); !errors.As(err, &start) || start.Errno != syscall.EOPNOTSUPP || !strings.Contains(start.Message, "feature sandbox") {
		t.Fatalf("a sandboxed spawn: %v, want EOPNOTSUPP naming the feature sandbox", err)
	}
	cmd = c.Command("/bin/true")
	cmd.Zygote.Sandbox = &Sandbox{Filesystem: &Filesystem{Mounts: []Mount{{Kind: Bind, Source: "tmp", Destination: "/tmp"}}}}
	if err := cmd.Start(); !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("a relative bind source: %v, want EINVAL", err)
	}
	out, err := c.Command("/bin/echo", "after").Output()
	if err != nil || string(out) != "after\n" {
		t.Fatalf("a spawn after the refusals: %q, %v", out, err)
	}
}

// TestSandboxConfinesTheChild runs children in sandboxes of the real
// daemon: an empty network namespace shows only loopback, the default
// seccomp profile refuses unshare, and the child reports what confined it.
func TestSandboxConfinesTheChild(t *testing.T) {
	c := dial(t)
	defer c.Close()
	if !c.Offers(featureSandbox) {
		t.Skip("SKIP: this daemon does not offer sandbox (it needs root or user namespaces)")
	}
	cmd := c.Command("/bin/sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
	cmd.Zygote.Sandbox = &Sandbox{Network: NetworkNone}
	out, err := cmd.Output()
	if err != nil || string(out) != "lo\n" {
		t.Fatalf("interfaces under network none: %q, %v; want only lo", out, err)
	}
	if cmd.Process.Sandbox == nil || !slices.Contains(cmd.Process.Sandbox.Namespaces, "net") {
		t.Fatalf("applied sandbox %+v: no net namespace reported", cmd.Process.Sandbox)
	}
	cmd = c.Command("unshare", "--ipc", "true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("unshare without a sandbox: %v", err)
	}
	cmd = c.Command("unshare", "--ipc", "true")
	cmd.Zygote.Sandbox = &Sandbox{Seccomp: "default"}
	var exit *ExitError
	if err := cmd.Run(); !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("unshare under the default seccomp profile: %v, want a failure", err)
	}
	if cmd.Process.Sandbox == nil || cmd.Process.Sandbox.Seccomp != "default" {
		t.Fatalf("applied sandbox %+v: seccomp default not reported", cmd.Process.Sandbox)
	}
}

// TestStatusShowsPeers: the daemon's status lists this peer's uid, with
// its connection and a running child counted, within its shares.
func TestStatusShowsPeers(t *testing.T) {
	c := dial(t)
	defer c.Close()
	if c.ProtocolVersion() < sandboxSince {
		t.Fatalf("the daemon speaks protocol version %d; peers need %d", c.ProtocolVersion(), sandboxSince)
	}
	sleeper := c.Command("/bin/sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	s, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	var mine *PeerUse
	for i := range s.Peers {
		if s.Peers[i].UID == uint32(os.Geteuid()) {
			mine = &s.Peers[i]
		}
	}
	if mine == nil {
		t.Fatalf("status peers %+v lack uid %d", s.Peers, os.Geteuid())
	}
	if mine.Connections < 1 || mine.Children < 1 || mine.Children > mine.ChildrenLimit || mine.Connections > mine.ConnectionsLimit {
		t.Fatalf("uid %d: %+v, want at least one connection and one child, within the limits", os.Geteuid(), *mine)
	}
}
