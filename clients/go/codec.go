package zygote

// The wire format of proto/PROTOCOL.md §3-4: postcard, one message per
// frame. Every type below mirrors the Rust type of the same name, and its
// JSON form is serde's externally tagged one, so that the shared vectors in
// proto/vectors/frames.json can be compared field for field.

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"
)

// protocolVersion is the newest version of proto/PROTOCOL.md this package
// speaks, sent in Hello; the daemon answers in the newest version both know.
const protocolVersion = 4

// oldestProtocolVersion is the oldest version this package reads a HelloAck
// in; a daemon answers no older than the client's own version unless it
// is older itself.
const oldestProtocolVersion = 1

// featuresSince is the first version whose HelloAck lists the daemon's
// optional features.
const featuresSince = 2

// sandboxSince is the first version with SpawnRequest.sandbox,
// Spawned.sandbox, SpawnStage::Sandbox and StatusReply's peers and
// spawners. An older connection uses the layouts without them.
const sandboxSince = 3

// templatesSince is the first version with warm templates: the messages
// Template, SpawnFromTemplate and ListTemplates, their replies
// TemplateReady and Templates, and SpawnStage::Template. It only adds
// variants: every older layout is unchanged.
const templatesSince = 4

// bstr is a byte string: postcard bytes, JSON an array of integers.
type bstr []byte

func (b bstr) MarshalJSON() ([]byte, error) {
	ints := make([]int, len(b))
	for i, v := range b {
		ints[i] = int(v)
	}
	return json.Marshal(ints)
}

func (b *bstr) UnmarshalJSON(data []byte) error {
	var ints []uint8Number
	if err := json.Unmarshal(data, &ints); err != nil {
		return err
	}
	if ints == nil {
		return errors.New("bytes: expected an array, got null")
	}
	out := make([]byte, len(ints))
	for i, v := range ints {
		out[i] = byte(v)
	}
	*b = out
	return nil
}

// strBytes is s's bytes without a copy, for encoding: the encoder only
// reads them, and the request never outlives the strings.
func strBytes(s string) bstr {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// uint8Number decodes a JSON number 0-255 (a plain []byte would expect base64).
type uint8Number uint8

// optBytes is an optional byte string: nil is none.
type optBytes []byte

func (b optBytes) MarshalJSON() ([]byte, error) {
	if b == nil {
		return []byte("null"), nil
	}
	return bstr(b).MarshalJSON()
}

func (b *optBytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var v bstr
	if err := v.UnmarshalJSON(data); err != nil {
		return err
	}
	*b = optBytes(v)
	return nil
}

type clientMessage struct {
	Hello  *hello         `json:"Hello,omitempty"`
	Spawn  *spawnRequest  `json:"Spawn,omitempty"`
	Signal *signalRequest `json:"Signal,omitempty"`
	Status *statusRequest `json:"Status,omitempty"`
	// Upgrade asks the daemon to upgrade in place (`zygote upgrade`).
	Upgrade *upgradeRequest `json:"Upgrade,omitempty"`
	// Template, SpawnFromTemplate and ListTemplates are version 4's.
	Template          *templateRequest      `json:"Template,omitempty"`
	SpawnFromTemplate *templateSpawnRequest `json:"SpawnFromTemplate,omitempty"`
	ListTemplates     *templateListRequest  `json:"ListTemplates,omitempty"`
}

type serverMessage struct {
	HelloAck      *helloAck       `json:"HelloAck,omitempty"`
	Spawned       *spawned        `json:"Spawned,omitempty"`
	SpawnFailed   *spawnFailed    `json:"SpawnFailed,omitempty"`
	Exited        *exitNotice     `json:"Exited,omitempty"`
	SignalSent    *signalSent     `json:"SignalSent,omitempty"`
	RequestFailed *requestFailed  `json:"RequestFailed,omitempty"`
	ProtocolError *protocolError  `json:"ProtocolError,omitempty"`
	Status        *statusReply    `json:"Status,omitempty"`
	Stopped       *stopNotice     `json:"Stopped,omitempty"`
	Continued     *continueNotice `json:"Continued,omitempty"`
	// TemplateReady and Templates are version 4's.
	TemplateReady *templateReady `json:"TemplateReady,omitempty"`
	Templates     *templateList  `json:"Templates,omitempty"`
}

type hello struct {
	ProtocolVersion uint32 `json:"protocol_version"`
	Client          string `json:"client"`
}

type limits struct {
	MaxFrameBytes  uint32 `json:"max_frame_bytes"`
	MaxFdsPerFrame uint32 `json:"max_fds_per_frame"`
}

// helloAck's layout follows its version: version 1 ends after Limits,
// version 2 adds Features.
type helloAck struct {
	ProtocolVersion uint32   `json:"protocol_version"`
	ServerVersion   string   `json:"server_version"`
	Limits          limits   `json:"limits"`
	Features        []string `json:"features,omitempty"`
}

// stdioKind is StdioSpec's variant.
type stdioKind uint8

const (
	stdioNull stdioKind = iota
	stdioPipe
	stdioFd
)

type stdioSpec struct {
	Kind stdioKind
	Fd   uint32 // the attached index, for stdioFd
}

func (s stdioSpec) MarshalJSON() ([]byte, error) {
	switch s.Kind {
	case stdioNull:
		return []byte(`"Null"`), nil
	case stdioPipe:
		return []byte(`"Pipe"`), nil
	default:
		return json.Marshal(map[string]uint32{"Fd": s.Fd})
	}
}

func (s *stdioSpec) UnmarshalJSON(data []byte) error {
	var name string
	if json.Unmarshal(data, &name) == nil {
		switch name {
		case "Null":
			*s = stdioSpec{Kind: stdioNull}
		case "Pipe":
			*s = stdioSpec{Kind: stdioPipe}
		default:
			return fmt.Errorf("StdioSpec: unknown variant %q", name)
		}
		return nil
	}
	var fd struct {
		Fd *uint32 `json:"Fd"`
	}
	if err := json.Unmarshal(data, &fd); err != nil || fd.Fd == nil {
		return fmt.Errorf("StdioSpec: expected \"Null\", \"Pipe\" or {\"Fd\": n}, got %s", data)
	}
	*s = stdioSpec{Kind: stdioFd, Fd: *fd.Fd}
	return nil
}

type envVar struct {
	Key   bstr `json:"key"`
	Value bstr `json:"value"`
}

type fdMapping struct {
	AttachedIndex uint32 `json:"attached_index"`
	ChildFd       int32  `json:"child_fd"`
}

type resourceLimit struct {
	Resource uint32 `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

type userSpec struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
}

type killOnClose struct {
	Signal       int32 `json:"signal"`
	ProcessGroup bool  `json:"process_group"`
}

type timeoutSpec struct {
	Millis      uint64 `json:"millis"`
	GraceMillis uint64 `json:"grace_millis"`
}

type spawnRequest struct {
	ID             uint64          `json:"id"`
	Program        bstr            `json:"program"`
	Argv0          optBytes        `json:"argv0"`
	Args           []bstr          `json:"args"`
	Env            []envVar        `json:"env"`
	Cwd            optBytes        `json:"cwd"`
	Stdin          stdioSpec       `json:"stdin"`
	Stdout         stdioSpec       `json:"stdout"`
	Stderr         stdioSpec       `json:"stderr"`
	FdMappings     []fdMapping     `json:"fd_mappings"`
	NewSession     bool            `json:"new_session"`
	ProcessGroup   *int32          `json:"process_group"`
	Umask          *uint32         `json:"umask"`
	Rlimits        []resourceLimit `json:"rlimits"`
	User           *userSpec       `json:"user"`
	KillOnClose    *killOnClose    `json:"kill_on_close"`
	Timeout        *timeoutSpec    `json:"timeout"`
	Pty            *ptySpec        `json:"pty"`
	ReportStops    bool            `json:"report_stops"`
	Cgroup         *cgroupSpec     `json:"cgroup"`
	IgnoredSignals uint64          `json:"ignored_signals"`
	Nice           *int32          `json:"nice"`
	CPUAffinity    []uint32        `json:"cpu_affinity"`
	OomScoreAdj    *int32          `json:"oom_score_adj"`
	// LargeArgs is unused by this client: it never sends a frame over the limit.
	LargeArgs *uint32 `json:"large_args"`
	// DeferSpawned asks for Spawned only if the child still runs 10
	// to 20 ms after exec; a child that ends sooner gets Exited alone.
	DeferSpawned bool `json:"defer_spawned"`
	// Sandbox confines the child (version 3 on).
	Sandbox *sandboxSpec `json:"sandbox"`

	// envEncoded and rlimitsEncoded, when set, are Env and Rlimits
	// already encoded (count and entries), which the encoder copies: the
	// client encodes the inherited environment and the copied limits
	// once, not per spawn.
	envEncoded, rlimitsEncoded []byte
}

// cgroupSpec sets limits and whole-tree behaviour of the child's cgroup
// (PROTOCOL.md 4.6f).
type cgroupSpec struct {
	KillTree      bool    `json:"kill_tree"`
	WaitTree      bool    `json:"wait_tree"`
	MemoryMax     *uint64 `json:"memory_max"`
	MemorySwapMax *uint64 `json:"memory_swap_max"`
	PidsMax       *uint64 `json:"pids_max"`
	CPUMax        *cpuMax `json:"cpu_max"`
	CPUWeight     *uint32 `json:"cpu_weight"`
	IOWeight      *uint32 `json:"io_weight"`
}

type cpuMax struct {
	QuotaMicros  uint64 `json:"quota_micros"`
	PeriodMicros uint64 `json:"period_micros"`
}

// treeUsage is what a child's whole cgroup used (PROTOCOL.md 4.17a).
type treeUsage struct {
	UserMicros      uint64  `json:"user_micros"`
	SystemMicros    uint64  `json:"system_micros"`
	MemoryPeakBytes *uint64 `json:"memory_peak_bytes"`
	OomKills        uint64  `json:"oom_kills"`
	MemoryMax       *uint64 `json:"memory_max"`
}

// windowSize is a terminal's size in character cells.
type windowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ptySpec asks the daemon for a new pseudo-terminal on the child's fds 0-2.
type ptySpec struct {
	Window windowSize `json:"window"`
}

// stopNotice says a child was stopped; sent only for report_stops spawns.
type stopNotice struct {
	ID     uint64 `json:"id"`
	Signal int32  `json:"signal"`
}

// continueNotice says a stopped child was continued.
type continueNotice struct {
	ID uint64 `json:"id"`
}

type signalRequest struct {
	ID      uint64 `json:"id"`
	SpawnID uint64 `json:"spawn_id"`
	Signal  int32  `json:"signal"`
}

type statusRequest struct {
	ID uint64 `json:"id"`
}

type upgradeRequest struct {
	ID uint64 `json:"id"`
}

type spawned struct {
	ID  uint64 `json:"id"`
	Pid int32  `json:"pid"`
	// Sandbox is what confined the child (version 3 on).
	Sandbox *appliedSandbox `json:"sandbox"`
}

// spawnStage is SpawnStage's variant index.
type spawnStage uint8

var stageNames = [...]string{
	"Validate", "Pipe", "Clone", "Signals", "Setsid", "Setpgid", "Setrlimit",
	"Chdir", "Dup", "CloseFds", "Exec", "Admission", "Setgroups", "Setgid", "Setuid",
	"Cgroup", "Nice", "Affinity", "OomScoreAdj", "Sandbox", "Template",
}

// stagesIn is how many SpawnStage variants a connection of version v
// may receive: Sandbox is sent as Exec before version 3, and Template
// only answers version 4's requests.
func stagesIn(v uint32) int {
	switch {
	case v < sandboxSince:
		return len(stageNames) - 2
	case v < templatesSince:
		return len(stageNames) - 1
	}
	return len(stageNames)
}

func (s spawnStage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("SpawnStage(%d)", uint8(s))
}

func (s spawnStage) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

func (s *spawnStage) UnmarshalJSON(data []byte) error {
	i, err := unitVariant(data, stageNames[:], "SpawnStage")
	*s = spawnStage(i)
	return err
}

type spawnFailed struct {
	ID      uint64     `json:"id"`
	Stage   spawnStage `json:"stage"`
	Errno   int32      `json:"errno"`
	Message string     `json:"message"`
}

type signaled struct {
	Signal     int32 `json:"signal"`
	CoreDumped bool  `json:"core_dumped"`
}

// exitStatus is ExitStatus: exactly one field is set.
type exitStatus struct {
	Exited   *int32    `json:"Exited,omitempty"`
	Signaled *signaled `json:"Signaled,omitempty"`
}

type resourceUsage struct {
	UserMicros   uint64 `json:"user_micros"`
	SystemMicros uint64 `json:"system_micros"`
	MaxRssKiB    uint64 `json:"max_rss_kib"`
}

type exitNotice struct {
	ID       uint64        `json:"id"`
	Status   exitStatus    `json:"status"`
	Usage    resourceUsage `json:"usage"`
	TimedOut bool          `json:"timed_out"`
	Tree     *treeUsage    `json:"tree"`
	// Pid is the child's pid, for a deferred spawn that got no Spawned.
	Pid int32 `json:"pid"`
}

type signalSent struct {
	ID uint64 `json:"id"`
}

type requestFailed struct {
	ID      uint64 `json:"id"`
	Errno   int32  `json:"errno"`
	Message string `json:"message"`
}

// protocolErrorKind is ProtocolErrorKind's variant index.
type protocolErrorKind uint8

var protocolErrorNames = [...]string{
	"Malformed", "TooLarge", "UnsupportedVersion", "UnexpectedMessage",
	"UnexpectedFds", "PermissionDenied", "Busy",
}

func (k protocolErrorKind) String() string {
	if int(k) < len(protocolErrorNames) {
		return protocolErrorNames[k]
	}
	return fmt.Sprintf("ProtocolErrorKind(%d)", uint8(k))
}

func (k protocolErrorKind) MarshalJSON() ([]byte, error) { return json.Marshal(k.String()) }

func (k *protocolErrorKind) UnmarshalJSON(data []byte) error {
	i, err := unitVariant(data, protocolErrorNames[:], "ProtocolErrorKind")
	*k = protocolErrorKind(i)
	return err
}

func unitVariant(data []byte, names []string, what string) (int, error) {
	var name string
	if err := json.Unmarshal(data, &name); err != nil {
		return 0, fmt.Errorf("%s: expected a string, got %s", what, data)
	}
	for i, n := range names {
		if n == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%s: unknown variant %q", what, name)
}

type protocolError struct {
	Kind    protocolErrorKind `json:"kind"`
	Message string            `json:"message"`
}

type statusReply struct {
	ID                  uint64 `json:"id"`
	ServerVersion       string `json:"server_version"`
	Pid                 int32  `json:"pid"`
	UptimeMillis        uint64 `json:"uptime_millis"`
	ConnectionsOpen     uint64 `json:"connections_open"`
	ConnectionsAccepted uint64 `json:"connections_accepted"`
	ChildrenRunning     uint64 `json:"children_running"`
	SpawnsSucceeded     uint64 `json:"spawns_succeeded"`
	SpawnsFailed        uint64 `json:"spawns_failed"`
	// Peers and Spawners are in the reply from version 3 on.
	Peers    []peerUse     `json:"peers"`
	Spawners []spawnerInfo `json:"spawners"`
}

// ---- encoding ----

type encoder struct{ b []byte }

func (e *encoder) varint(v uint64) {
	for v >= 0x80 {
		e.b = append(e.b, byte(v)|0x80)
		v >>= 7
	}
	e.b = append(e.b, byte(v))
}

func (e *encoder) i32(v int32) { e.varint(uint64(uint32((v << 1) ^ (v >> 31)))) }

func (e *encoder) boolean(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) bytes(v []byte) {
	e.varint(uint64(len(v)))
	e.b = append(e.b, v...)
}

func (e *encoder) option(some bool) bool {
	e.boolean(some)
	return some
}

func (e *encoder) stdio(s stdioSpec) {
	e.varint(uint64(s.Kind))
	if s.Kind == stdioFd {
		e.varint(uint64(s.Fd))
	}
}

// env encodes a spawn request's environment.
func (e *encoder) env(env []envVar) {
	e.varint(uint64(len(env)))
	for _, v := range env {
		e.bytes(v.Key)
		e.bytes(v.Value)
	}
}

// rlimits encodes a spawn request's resource limits.
func (e *encoder) rlimits(ls []resourceLimit) {
	e.varint(uint64(len(ls)))
	for _, l := range ls {
		e.varint(uint64(l.Resource))
		e.varint(l.Soft)
		e.varint(l.Hard)
	}
}

// spawn encodes a SpawnRequest in the layout of version v.
func (e *encoder) spawn(r *spawnRequest, v uint32) error {
	e.varint(r.ID)
	e.bytes(r.Program)
	if e.option(r.Argv0 != nil) {
		e.bytes(r.Argv0)
	}
	e.varint(uint64(len(r.Args)))
	for _, a := range r.Args {
		e.bytes(a)
	}
	if r.envEncoded != nil {
		e.b = append(e.b, r.envEncoded...)
	} else {
		e.env(r.Env)
	}
	if e.option(r.Cwd != nil) {
		e.bytes(r.Cwd)
	}
	e.stdio(r.Stdin)
	e.stdio(r.Stdout)
	e.stdio(r.Stderr)
	e.varint(uint64(len(r.FdMappings)))
	for _, m := range r.FdMappings {
		e.varint(uint64(m.AttachedIndex))
		e.i32(m.ChildFd)
	}
	e.boolean(r.NewSession)
	if e.option(r.ProcessGroup != nil) {
		e.i32(*r.ProcessGroup)
	}
	if e.option(r.Umask != nil) {
		e.varint(uint64(*r.Umask))
	}
	if r.rlimitsEncoded != nil {
		e.b = append(e.b, r.rlimitsEncoded...)
	} else {
		e.rlimits(r.Rlimits)
	}
	if e.option(r.User != nil) {
		e.varint(uint64(r.User.UID))
		e.varint(uint64(r.User.GID))
		e.varint(uint64(len(r.User.Groups)))
		for _, g := range r.User.Groups {
			e.varint(uint64(g))
		}
	}
	if e.option(r.KillOnClose != nil) {
		e.i32(r.KillOnClose.Signal)
		e.boolean(r.KillOnClose.ProcessGroup)
	}
	if e.option(r.Timeout != nil) {
		e.varint(r.Timeout.Millis)
		e.varint(r.Timeout.GraceMillis)
	}
	if e.option(r.Pty != nil) {
		e.varint(uint64(r.Pty.Window.Rows))
		e.varint(uint64(r.Pty.Window.Cols))
	}
	e.boolean(r.ReportStops)
	if e.option(r.Cgroup != nil) {
		c := r.Cgroup
		e.boolean(c.KillTree)
		e.boolean(c.WaitTree)
		e.optU64(c.MemoryMax)
		e.optU64(c.MemorySwapMax)
		e.optU64(c.PidsMax)
		if e.option(c.CPUMax != nil) {
			e.varint(c.CPUMax.QuotaMicros)
			e.varint(c.CPUMax.PeriodMicros)
		}
		e.optU32(c.CPUWeight)
		e.optU32(c.IOWeight)
	}
	e.varint(r.IgnoredSignals)
	if e.option(r.Nice != nil) {
		e.i32(*r.Nice)
	}
	e.varint(uint64(len(r.CPUAffinity)))
	for _, cpu := range r.CPUAffinity {
		e.varint(uint64(cpu))
	}
	if e.option(r.OomScoreAdj != nil) {
		e.i32(*r.OomScoreAdj)
	}
	if e.option(r.LargeArgs != nil) {
		e.varint(uint64(*r.LargeArgs))
	}
	e.boolean(r.DeferSpawned)
	if v >= sandboxSince {
		e.sandbox(r.Sandbox)
	} else if r.Sandbox != nil {
		return errSandboxVersion(v)
	}
	return nil
}

func (e *encoder) optU64(v *uint64) {
	if e.option(v != nil) {
		e.varint(*v)
	}
}

func (e *encoder) optU32(v *uint32) {
	if e.option(v != nil) {
		e.varint(uint64(*v))
	}
}

func (d *decoder) optU64(what string) *uint64 {
	if !d.option(what) {
		return nil
	}
	v := d.u64(what)
	return &v
}

func (d *decoder) optU32(what string) *uint32 {
	if !d.option(what) {
		return nil
	}
	v := d.u32(what)
	return &v
}

var errNoVariant = errors.New("message has no variant set")

// encodeClient encodes one client frame in the newest version's layout.
func encodeClient(m *clientMessage) ([]byte, error) { return encodeClientTo(nil, m, protocolVersion) }

// encodeClientTo encodes one client frame in the layout of version v into
// buf's storage, when it is large enough, or into a new slice.
func encodeClientTo(buf []byte, m *clientMessage, v uint32) ([]byte, error) {
	size := 256
	r := m.Spawn
	if m.SpawnFromTemplate != nil {
		r = &m.SpawnFromTemplate.Spawn
	}
	if r != nil {
		// One allocation for the usual request: the strings, and a few
		// bytes of length and tags each.
		size += len(r.Program) + len(r.Argv0) + len(r.Cwd) + 4*len(r.CPUAffinity)
		for _, a := range r.Args {
			size += len(a) + 3
		}
		if r.envEncoded != nil {
			size += len(r.envEncoded)
		} else {
			for _, v := range r.Env {
				size += len(v.Key) + len(v.Value) + 6
			}
		}
		if r.rlimitsEncoded != nil {
			size += len(r.rlimitsEncoded)
		} else {
			size += 21 * len(r.Rlimits)
		}
	}
	if cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	e := &encoder{b: buf[:0]}
	switch {
	case m.Hello != nil:
		e.varint(0)
		e.varint(uint64(m.Hello.ProtocolVersion))
		e.bytes([]byte(m.Hello.Client))
	case m.Spawn != nil:
		e.varint(1)
		if err := e.spawn(m.Spawn, v); err != nil {
			return nil, err
		}
	case m.Signal != nil:
		e.varint(2)
		e.varint(m.Signal.ID)
		e.varint(m.Signal.SpawnID)
		e.i32(m.Signal.Signal)
	case m.Status != nil:
		e.varint(3)
		e.varint(m.Status.ID)
	case m.Upgrade != nil:
		e.varint(4)
		e.varint(m.Upgrade.ID)
	case m.Template != nil || m.SpawnFromTemplate != nil || m.ListTemplates != nil:
		if v < templatesSince {
			return nil, errTemplatesVersion(v)
		}
		if err := e.templateMessage(m, v); err != nil {
			return nil, err
		}
	default:
		return nil, errNoVariant
	}
	return e.b, nil
}

// ---- decoding ----

// decoder reads one frame. The first error sticks; later reads return zero.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("at byte %d: "+format, append([]any{d.off}, args...)...)
	}
}

// varint reads an unsigned LEB128 of at most maxBytes bytes whose last byte
// is at most lastMax.
func (d *decoder) varint(maxBytes int, lastMax byte, what string) uint64 {
	if d.err != nil {
		return 0
	}
	var v uint64
	for i := 0; i < maxBytes; i++ {
		if d.off >= len(d.b) {
			d.fail("frame ends inside %s", what)
			return 0
		}
		c := d.b[d.off]
		d.off++
		if i == maxBytes-1 {
			if c > lastMax {
				d.fail("%s varint out of range", what)
				return 0
			}
			return v | uint64(c)<<(7*i)
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v
		}
	}
	return v
}

func (d *decoder) u16(what string) uint16 { return uint16(d.varint(3, 0x03, what)) }
func (d *decoder) u32(what string) uint32 { return uint32(d.varint(5, 0x0f, what)) }
func (d *decoder) u64(what string) uint64 { return d.varint(10, 0x01, what) }

func (d *decoder) i32(what string) int32 {
	z := d.u32(what)
	return int32(z>>1) ^ -int32(z&1)
}

func (d *decoder) byteVal(what string) byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.fail("frame ends before %s", what)
		return 0
	}
	c := d.b[d.off]
	d.off++
	return c
}

func (d *decoder) boolean(what string) bool { return d.zeroOrOne(what, "bool byte") }

func (d *decoder) option(what string) bool { return d.zeroOrOne(what, "option tag") }

// zeroOrOne reads a byte that must be 0 or 1: a bool, or an option's tag.
func (d *decoder) zeroOrOne(what, kind string) bool {
	switch c := d.byteVal(what); c {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("%s: %s %#02x is neither 0 nor 1", what, kind, c)
		return false
	}
}

// count reads a length or element count; each element takes at least one
// byte, so a count beyond the rest of the frame is an error, not an allocation.
func (d *decoder) count(what string) int {
	n := d.u64(what)
	if d.err == nil && n > uint64(len(d.b)-d.off) {
		d.fail("%s: length %d exceeds the %d bytes left", what, n, len(d.b)-d.off)
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(what string) []byte {
	n := d.count(what)
	if d.err != nil {
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[d.off:d.off+n])
	d.off += n
	return out
}

func (d *decoder) str(what string) string {
	b := d.bytes(what)
	if d.err == nil && !utf8.Valid(b) {
		d.fail("%s is not valid UTF-8", what)
	}
	return string(b)
}

func (d *decoder) variant(what string, count int) int {
	v := d.u32(what)
	if d.err == nil && v >= uint32(count) {
		d.fail("%s: variant index %d does not exist", what, v)
		return 0
	}
	return int(v)
}

func (d *decoder) stdio(what string) stdioSpec {
	k := stdioKind(d.variant(what, 3))
	s := stdioSpec{Kind: k}
	if k == stdioFd {
		s.Fd = d.u32(what)
	}
	return s
}

// helloAck reads a HelloAck in the layout of the version it starts with.
func (d *decoder) helloAck() *helloAck {
	a := &helloAck{ProtocolVersion: d.u32("protocol_version"), ServerVersion: d.str("server_version"),
		Limits: limits{d.u32("max_frame_bytes"), d.u32("max_fds_per_frame")}}
	if a.ProtocolVersion >= featuresSince {
		n := d.count("features")
		a.Features = make([]string, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			a.Features = append(a.Features, d.str("feature"))
		}
	}
	return a
}

func (d *decoder) finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d bytes left over after the message", len(d.b)-d.off)
	}
	return d.err
}

// decodeServer decodes one daemon frame in the newest version's layout.
func decodeServer(b []byte) (*serverMessage, error) { return decodeServerIn(b, protocolVersion) }

// decodeServerIn decodes one daemon frame in the layout of version v.
func decodeServerIn(b []byte, v uint32) (*serverMessage, error) {
	d := &decoder{b: b}
	m := &serverMessage{}
	variants := 10
	if v >= templatesSince {
		variants = 12
	}
	switch d.variant("ServerMessage", variants) {
	case 0:
		m.HelloAck = d.helloAck()
	case 1:
		m.Spawned = &spawned{ID: d.u64("id"), Pid: d.i32("pid")}
		if v >= sandboxSince {
			m.Spawned.Sandbox = d.appliedSandbox()
		}
	case 2:
		m.SpawnFailed = &spawnFailed{d.u64("id"), spawnStage(d.variant("SpawnStage", stagesIn(v))),
			d.i32("errno"), d.str("message")}
	case 3:
		x := &exitNotice{ID: d.u64("id")}
		if d.variant("ExitStatus", 2) == 0 {
			code := d.i32("exit code")
			x.Status.Exited = &code
		} else {
			x.Status.Signaled = &signaled{d.i32("signal"), d.boolean("core_dumped")}
		}
		x.Usage = resourceUsage{d.u64("user_micros"), d.u64("system_micros"), d.u64("max_rss_kib")}
		x.TimedOut = d.boolean("timed_out")
		if d.option("tree") {
			x.Tree = &treeUsage{UserMicros: d.u64("user_micros"), SystemMicros: d.u64("system_micros")}
			x.Tree.MemoryPeakBytes = d.optU64("memory_peak_bytes")
			x.Tree.OomKills = d.u64("oom_kills")
			x.Tree.MemoryMax = d.optU64("memory_max")
		}
		x.Pid = d.i32("pid")
		m.Exited = x
	case 4:
		m.SignalSent = &signalSent{d.u64("id")}
	case 5:
		m.RequestFailed = &requestFailed{d.u64("id"), d.i32("errno"), d.str("message")}
	case 6:
		m.ProtocolError = &protocolError{protocolErrorKind(d.variant("ProtocolErrorKind", len(protocolErrorNames))),
			d.str("message")}
	case 7:
		m.Status = &statusReply{ID: d.u64("id"), ServerVersion: d.str("server_version"), Pid: d.i32("pid"),
			UptimeMillis: d.u64("uptime_millis"), ConnectionsOpen: d.u64("connections_open"),
			ConnectionsAccepted: d.u64("connections_accepted"), ChildrenRunning: d.u64("children_running"),
			SpawnsSucceeded: d.u64("spawns_succeeded"), SpawnsFailed: d.u64("spawns_failed")}
		if v >= sandboxSince {
			d.statusTail(m.Status)
		}
	case 8:
		m.Stopped = &stopNotice{d.u64("id"), d.i32("signal")}
	case 9:
		m.Continued = &continueNotice{d.u64("id")}
	case 10:
		m.TemplateReady = &templateReady{d.u64("id"), d.u64("template"), d.i32("pid"), d.boolean("reused")}
	case 11:
		m.Templates = d.templateList()
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}

// name is the variant's name, for errors that say what arrived.
func (m *serverMessage) name() string {
	switch {
	case m.HelloAck != nil:
		return "HelloAck"
	case m.Spawned != nil:
		return "Spawned"
	case m.SpawnFailed != nil:
		return "SpawnFailed"
	case m.Exited != nil:
		return "Exited"
	case m.SignalSent != nil:
		return "SignalSent"
	case m.RequestFailed != nil:
		return "RequestFailed"
	case m.ProtocolError != nil:
		return "ProtocolError"
	case m.Status != nil:
		return "Status"
	case m.Stopped != nil:
		return "Stopped"
	case m.Continued != nil:
		return "Continued"
	case m.TemplateReady != nil:
		return "TemplateReady"
	case m.Templates != nil:
		return "Templates"
	}
	return "nothing"
}
