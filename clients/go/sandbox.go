package zygote

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"
)

// featureSandbox is the feature a daemon lists in its HelloAck when it
// enforces sandboxes.
const featureSandbox = "sandbox"

// Sandbox confines one child (Options.Sandbox): the daemon sets it up
// between clone and exec. It needs a daemon that offers the feature
// "sandbox" (Client.Offers): against one that does not, Start fails
// before anything is sent, with a *StartError at stage "Validate" whose
// errno is EOPNOTSUPP. A daemon that cannot honour a field refuses the
// spawn (a *StartError, stage "Sandbox" for a failed setup step); a
// sandbox is never weakened silently. What was applied is in
// Process.Sandbox once the child started.
//
// The zero value asks for no restriction beyond what is always on under
// a sandbox (no_new_privs, no capabilities, only the fds asked for).
type Sandbox struct {
	// Profile names a profile of the daemon's policy file, applied first;
	// every other field can only tighten it. "" applies none.
	Profile string
	// Filesystem is the child's filesystem view: nil keeps the host's;
	// otherwise a new mount namespace with an empty root and these mounts.
	Filesystem *Filesystem
	// Network is the network the child sees.
	Network Network
	// Isolate gives the child new pid, ipc and uts namespaces.
	Isolate bool
	// Hostname is the hostname inside; it needs Isolate. "" keeps it.
	Hostname string
	// Seccomp names a seccomp profile ("default", "strict", or one of the
	// policy's); SeccompFilter is instead the text of a custom filter in
	// the documented format. At most one of them may be set.
	Seccomp       string
	SeccompFilter string
	// Landlock restricts file and TCP port access; nil applies none.
	Landlock *Landlock
}

// Filesystem is a sandbox's filesystem view: a new mount namespace whose
// root is an empty, read-only tmpfs, with these mounts made in order. A
// minimal /dev is always provided.
type Filesystem struct {
	Mounts []Mount
}

// Mount is one mount of a sandbox's filesystem view.
type Mount struct {
	Kind MountKind
	// Source is an absolute host path; empty for Tmpfs.
	Source string
	// Destination is an absolute path inside the sandbox.
	Destination string
}

// MountKind is what a Mount makes.
type MountKind uint8

const (
	// ReadOnlyBind binds a host path read-only.
	ReadOnlyBind MountKind = iota
	// Bind binds a host path read-write.
	Bind
	// Tmpfs mounts an empty tmpfs.
	Tmpfs
)

func (k MountKind) String() string {
	if int(k) < len(mountKindNames) {
		return mountKindNames[k]
	}
	return fmt.Sprintf("MountKind(%d)", uint8(k))
}

// Network is the network a sandboxed child sees.
type Network uint8

const (
	// NetworkHost is the host's network.
	NetworkHost Network = iota
	// NetworkNone is an empty network namespace (loopback down).
	NetworkNone
)

func (n Network) String() string {
	if int(n) < len(networkModeNames) {
		return networkModeNames[n]
	}
	return fmt.Sprintf("Network(%d)", uint8(n))
}

// Landlock is a set of Landlock rules: the child may access only these
// paths, in these ways, and bind or connect only these TCP ports.
type Landlock struct {
	ReadOnly    []string
	ReadExecute []string
	ReadWrite   []string
	TCPBind     []uint16
	TCPConnect  []uint16
	// Require refuses the spawn when the kernel's Landlock ABI cannot
	// enforce every rule; without it Landlock is best effort, and
	// AppliedSandbox.LandlockComplete says whether every rule held.
	Require bool
}

// AppliedSandbox is what confined a child, as the daemon reported it.
type AppliedSandbox struct {
	// Profile is the profile applied (the policy's imposed one, or the
	// request's), "" for none.
	Profile string
	// Namespaces the child got: "mount", "pid", "ipc", "uts", "net", "user".
	Namespaces []string
	// Seccomp is the filter installed: a profile name, "custom", or "".
	Seccomp string
	// LandlockABI is the Landlock ABI version enforced, 0 when Landlock
	// was not applied.
	LandlockABI uint32
	// LandlockComplete is false when best-effort Landlock could not
	// enforce every requested rule.
	LandlockComplete bool
}

func newAppliedSandbox(a *appliedSandbox) *AppliedSandbox {
	if a == nil {
		return nil
	}
	out := &AppliedSandbox{Profile: deref(a.Profile), Namespaces: slices.Clone(a.Namespaces),
		Seccomp: deref(a.Seccomp), LandlockComplete: a.LandlockComplete}
	if a.LandlockABI != nil {
		out.LandlockABI = *a.LandlockABI
	}
	return out
}

// spec checks every field against its wire type (and the rules the daemon
// would refuse it by, where they are plain) and returns the request's form.
func (s *Sandbox) spec() (*sandboxSpec, error) {
	out := &sandboxSpec{Network: networkMode(s.Network), Isolate: s.Isolate}
	if s.Network > NetworkNone {
		return nil, invalid("Sandbox.Network %d is neither NetworkHost nor NetworkNone", uint8(s.Network))
	}
	var err error
	if out.Profile, err = optText("Sandbox.Profile", s.Profile); err != nil {
		return nil, err
	}
	if out.Hostname, err = optText("Sandbox.Hostname", s.Hostname); err != nil {
		return nil, err
	}
	if s.Hostname != "" && !s.Isolate {
		return nil, invalid("Sandbox.Hostname %q needs Sandbox.Isolate (a uts namespace of its own)", s.Hostname)
	}
	if out.Seccomp, err = s.seccompSpec(); err != nil {
		return nil, err
	}
	if s.Filesystem != nil {
		out.Filesystem = &filesystemSpec{Mounts: make([]mountSpec, 0, len(s.Filesystem.Mounts))}
		for i, m := range s.Filesystem.Mounts {
			w, err := m.spec(i)
			if err != nil {
				return nil, err
			}
			out.Filesystem.Mounts = append(out.Filesystem.Mounts, w)
		}
	}
	if s.Landlock != nil {
		if out.Landlock, err = s.Landlock.spec(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Sandbox) seccompSpec() (*seccompSpec, error) {
	switch {
	case s.Seccomp != "" && s.SeccompFilter != "":
		return nil, invalid("Sandbox.Seccomp %q and Sandbox.SeccompFilter are both set; give one", s.Seccomp)
	case s.Seccomp != "":
		name, err := optText("Sandbox.Seccomp", s.Seccomp)
		return &seccompSpec{Profile: name}, err
	case s.SeccompFilter != "":
		text, err := optText("Sandbox.SeccompFilter", s.SeccompFilter)
		return &seccompSpec{Filter: text}, err
	}
	return nil, nil
}

func (m *Mount) spec(i int) (mountSpec, error) {
	what := fmt.Sprintf("Sandbox.Filesystem.Mounts[%d]", i)
	w := mountSpec{Kind: mountKind(m.Kind)}
	if m.Kind > Tmpfs {
		return w, invalid("%s.Kind %d is not a MountKind", what, uint8(m.Kind))
	}
	if m.Kind == Tmpfs {
		if m.Source != "" {
			return w, invalid("%s: a Tmpfs mount has no Source, got %q", what, m.Source)
		}
	} else if err := absPath(what+".Source", m.Source); err != nil {
		return w, err
	}
	if err := absPath(what+".Destination", m.Destination); err != nil {
		return w, err
	}
	w.Source, w.Destination = bstr(m.Source), bstr(m.Destination)
	return w, nil
}

func (l *Landlock) spec() (*landlockSpec, error) {
	out := &landlockSpec{TCPBind: slices.Clone(l.TCPBind), TCPConnect: slices.Clone(l.TCPConnect), Require: l.Require}
	if out.TCPBind == nil {
		out.TCPBind = []uint16{}
	}
	if out.TCPConnect == nil {
		out.TCPConnect = []uint16{}
	}
	for _, list := range []struct {
		name  string
		paths []string
		into  *[]bstr
	}{{"ReadOnly", l.ReadOnly, &out.ReadOnly}, {"ReadExecute", l.ReadExecute, &out.ReadExecute},
		{"ReadWrite", l.ReadWrite, &out.ReadWrite}} {
		*list.into = make([]bstr, 0, len(list.paths))
		for i, p := range list.paths {
			if err := absPath(fmt.Sprintf("Sandbox.Landlock.%s[%d]", list.name, i), p); err != nil {
				return nil, err
			}
			*list.into = append(*list.into, bstr(p))
		}
	}
	return out, nil
}

// absPath checks a path the daemon needs absolute: non-empty, starting
// with "/", without NUL.
func absPath(what, p string) error {
	if p == "" {
		return invalid("%s is empty; it must be an absolute path", what)
	}
	if !strings.HasPrefix(p, "/") {
		return invalid("%s %q is not an absolute path", what, p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return invalid("%s %q contains a NUL byte", what, p)
	}
	return nil
}

// optText is an optional wire string: nil for "", else valid UTF-8
// without NUL.
func optText(what, s string) (*string, error) {
	if s == "" {
		return nil, nil
	}
	if !utf8.ValidString(s) {
		return nil, invalid("%s %q is not valid UTF-8", what, s)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return nil, invalid("%s %q contains a NUL byte", what, s)
	}
	return &s, nil
}

// refuseUnoffered refuses, before anything is sent, a spawn that uses a
// feature the daemon does not offer, as the daemon would: a *StartError
// at stage Validate with EOPNOTSUPP, naming the feature.
func (c *connection) refuseUnoffered(m *clientMessage) error {
	if err := c.refuseTemplates(m); err != nil {
		return err
	}
	r := m.Spawn
	if r == nil || r.Sandbox == nil || slices.Contains(c.features, featureSandbox) {
		return nil
	}
	why := fmt.Sprintf("the zygote does not offer the feature %s", featureSandbox)
	if c.protocol < sandboxSince {
		why += fmt.Sprintf(" (it speaks protocol version %d; a sandbox needs %d)", c.protocol, sandboxSince)
	}
	return &StartError{Program: string(r.Program), Stage: "Validate", Errno: syscall.EOPNOTSUPP,
		Message: why + "; the child was not started"}
}
