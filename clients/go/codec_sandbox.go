package zygote

// The sandbox's wire types (PROTOCOL.md, version 3): SpawnRequest.sandbox,
// Spawned.sandbox and StatusReply's peers and spawners, with their
// encoders and decoders. Like the rest of the codec, each type mirrors
// the Rust type of the same name and has serde's JSON form.

import (
	"encoding/json"
	"fmt"
)

type sandboxSpec struct {
	Profile    *string         `json:"profile"`
	Filesystem *filesystemSpec `json:"filesystem"`
	Network    networkMode     `json:"network"`
	Isolate    bool            `json:"isolate"`
	Hostname   *string         `json:"hostname"`
	Seccomp    *seccompSpec    `json:"seccomp"`
	Landlock   *landlockSpec   `json:"landlock"`
}

type filesystemSpec struct {
	Mounts []mountSpec `json:"mounts"`
}

type mountSpec struct {
	Kind        mountKind `json:"kind"`
	Source      bstr      `json:"source"`
	Destination bstr      `json:"destination"`
}

// mountKind is MountKind's variant index.
type mountKind uint8

var mountKindNames = [...]string{"ReadOnlyBind", "Bind", "Tmpfs"}

func (k mountKind) MarshalJSON() ([]byte, error) { return json.Marshal(mountKindNames[k]) }

func (k *mountKind) UnmarshalJSON(data []byte) error {
	i, err := unitVariant(data, mountKindNames[:], "MountKind")
	*k = mountKind(i)
	return err
}

// networkMode is NetworkMode's variant index.
type networkMode uint8

var networkModeNames = [...]string{"Host", "None"}

func (n networkMode) MarshalJSON() ([]byte, error) { return json.Marshal(networkModeNames[n]) }

func (n *networkMode) UnmarshalJSON(data []byte) error {
	i, err := unitVariant(data, networkModeNames[:], "NetworkMode")
	*n = networkMode(i)
	return err
}

// seccompSpec is SeccompSpec: exactly one field is set.
type seccompSpec struct {
	Profile *string `json:"Profile,omitempty"`
	Filter  *string `json:"Filter,omitempty"`
}

type landlockSpec struct {
	ReadOnly    []bstr   `json:"read_only"`
	ReadExecute []bstr   `json:"read_execute"`
	ReadWrite   []bstr   `json:"read_write"`
	TCPBind     []uint16 `json:"tcp_bind"`
	TCPConnect  []uint16 `json:"tcp_connect"`
	Require     bool     `json:"require"`
}

type appliedSandbox struct {
	Profile          *string  `json:"profile"`
	Namespaces       []string `json:"namespaces"`
	Seccomp          *string  `json:"seccomp"`
	LandlockABI      *uint32  `json:"landlock_abi"`
	LandlockComplete bool     `json:"landlock_complete"`
}

type peerUse struct {
	UID              uint32  `json:"uid"`
	Connections      uint64  `json:"connections"`
	Children         uint64  `json:"children"`
	ChildrenLimit    uint64  `json:"children_limit"`
	ConnectionsLimit uint64  `json:"connections_limit"`
	SandboxProfile   *string `json:"sandbox_profile"`
}

type spawnerInfo struct {
	UID      uint32 `json:"uid"`
	Pid      int32  `json:"pid"`
	Spawns   uint64 `json:"spawns"`
	Restarts uint64 `json:"restarts"`
}

// ---- encoding ----

func (e *encoder) optStr(s *string) {
	if e.option(s != nil) {
		e.bytes([]byte(*s))
	}
}

func (e *encoder) byteList(l []bstr) {
	e.varint(uint64(len(l)))
	for _, b := range l {
		e.bytes(b)
	}
}

func (e *encoder) ports(l []uint16) {
	e.varint(uint64(len(l)))
	for _, p := range l {
		e.varint(uint64(p))
	}
}

// sandbox encodes option<SandboxSpec>.
func (e *encoder) sandbox(s *sandboxSpec) {
	if !e.option(s != nil) {
		return
	}
	e.optStr(s.Profile)
	if e.option(s.Filesystem != nil) {
		e.varint(uint64(len(s.Filesystem.Mounts)))
		for _, m := range s.Filesystem.Mounts {
			e.varint(uint64(m.Kind))
			e.bytes(m.Source)
			e.bytes(m.Destination)
		}
	}
	e.varint(uint64(s.Network))
	e.boolean(s.Isolate)
	e.optStr(s.Hostname)
	if e.option(s.Seccomp != nil) {
		if s.Seccomp.Filter != nil {
			e.varint(1)
			e.bytes([]byte(*s.Seccomp.Filter))
		} else {
			e.varint(0)
			e.bytes([]byte(deref(s.Seccomp.Profile)))
		}
	}
	if l := s.Landlock; e.option(l != nil) {
		e.byteList(l.ReadOnly)
		e.byteList(l.ReadExecute)
		e.byteList(l.ReadWrite)
		e.ports(l.TCPBind)
		e.ports(l.TCPConnect)
		e.boolean(l.Require)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// appliedSandbox encodes option<AppliedSandbox> (the daemon's side, for
// the tests).
func (e *encoder) appliedSandbox(a *appliedSandbox) {
	if !e.option(a != nil) {
		return
	}
	e.optStr(a.Profile)
	e.varint(uint64(len(a.Namespaces)))
	for _, n := range a.Namespaces {
		e.bytes([]byte(n))
	}
	e.optStr(a.Seccomp)
	e.optU32(a.LandlockABI)
	e.boolean(a.LandlockComplete)
}

// statusTail encodes StatusReply's version-3 fields (the daemon's side).
func (e *encoder) statusTail(s *statusReply) {
	e.varint(uint64(len(s.Peers)))
	for _, p := range s.Peers {
		e.varint(uint64(p.UID))
		e.varint(p.Connections)
		e.varint(p.Children)
		e.varint(p.ChildrenLimit)
		e.varint(p.ConnectionsLimit)
		e.optStr(p.SandboxProfile)
	}
	e.varint(uint64(len(s.Spawners)))
	for _, sp := range s.Spawners {
		e.varint(uint64(sp.UID))
		e.i32(sp.Pid)
		e.varint(sp.Spawns)
		e.varint(sp.Restarts)
	}
}

// ---- decoding ----

func (d *decoder) optStr(what string) *string {
	if !d.option(what) {
		return nil
	}
	s := d.str(what)
	return &s
}

func (d *decoder) strList(what string) []string {
	n := d.count(what)
	out := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.str(what))
	}
	return out
}

func (d *decoder) byteList(what string) []bstr {
	n := d.count(what)
	out := make([]bstr, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.bytes(what))
	}
	return out
}

func (d *decoder) ports(what string) []uint16 {
	n := d.count(what)
	out := make([]uint16, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.u16(what))
	}
	return out
}

// sandbox decodes option<SandboxSpec> (the daemon's side, for the tests).
func (d *decoder) sandbox() *sandboxSpec {
	if !d.option("sandbox") {
		return nil
	}
	s := &sandboxSpec{Profile: d.optStr("profile")}
	if d.option("filesystem") {
		n := d.count("mounts")
		s.Filesystem = &filesystemSpec{Mounts: make([]mountSpec, 0, n)}
		for i := 0; i < n && d.err == nil; i++ {
			s.Filesystem.Mounts = append(s.Filesystem.Mounts, mountSpec{
				Kind: mountKind(d.variant("MountKind", len(mountKindNames))), Source: d.bytes("source"),
				Destination: d.bytes("destination")})
		}
	}
	s.Network = networkMode(d.variant("NetworkMode", len(networkModeNames)))
	s.Isolate = d.boolean("isolate")
	s.Hostname = d.optStr("hostname")
	if d.option("seccomp") {
		kind := d.variant("SeccompSpec", 2)
		text := d.str("seccomp")
		if kind == 0 {
			s.Seccomp = &seccompSpec{Profile: &text}
		} else {
			s.Seccomp = &seccompSpec{Filter: &text}
		}
	}
	if d.option("landlock") {
		s.Landlock = &landlockSpec{ReadOnly: d.byteList("read_only"), ReadExecute: d.byteList("read_execute"),
			ReadWrite: d.byteList("read_write"), TCPBind: d.ports("tcp_bind"), TCPConnect: d.ports("tcp_connect"),
			Require: d.boolean("require")}
	}
	return s
}

// appliedSandbox decodes option<AppliedSandbox>.
func (d *decoder) appliedSandbox() *appliedSandbox {
	if !d.option("sandbox") {
		return nil
	}
	return &appliedSandbox{Profile: d.optStr("profile"), Namespaces: d.strList("namespaces"),
		Seccomp: d.optStr("seccomp"), LandlockABI: d.optU32("landlock_abi"),
		LandlockComplete: d.boolean("landlock_complete")}
}

// statusTail decodes StatusReply's version-3 fields.
func (d *decoder) statusTail(s *statusReply) {
	n := d.count("peers")
	s.Peers = make([]peerUse, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		s.Peers = append(s.Peers, peerUse{UID: d.u32("uid"), Connections: d.u64("connections"),
			Children: d.u64("children"), ChildrenLimit: d.u64("children_limit"),
			ConnectionsLimit: d.u64("connections_limit"), SandboxProfile: d.optStr("sandbox_profile")})
	}
	n = d.count("spawners")
	s.Spawners = make([]spawnerInfo, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		s.Spawners = append(s.Spawners, spawnerInfo{UID: d.u32("uid"), Pid: d.i32("pid"),
			Spawns: d.u64("spawns"), Restarts: d.u64("restarts")})
	}
}

// errSandboxVersion is a sandbox request encoded for a connection whose
// version has no room for it: refused, never dropped.
func errSandboxVersion(v uint32) error {
	return fmt.Errorf("zygote: a sandbox needs protocol version %d; the connection speaks %d", sandboxSince, v)
}
