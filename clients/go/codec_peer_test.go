package zygote

import "errors"

// The daemon's half of the codec, which the client never needs: encoding
// server frames and decoding client frames, for the conformance tests and
// the fake daemons of the tests.

// encodeServer encodes one daemon frame in the newest version's layout
// (used by the conformance tests).
func encodeServer(m *serverMessage) ([]byte, error) { return encodeServerIn(m, protocolVersion) }

// encodeServerIn encodes one daemon frame in the layout of version v.
func encodeServerIn(m *serverMessage, v uint32) ([]byte, error) {
	e := &encoder{}
	switch {
	case m.HelloAck != nil:
		e.varint(0)
		e.varint(uint64(m.HelloAck.ProtocolVersion))
		e.bytes([]byte(m.HelloAck.ServerVersion))
		e.varint(uint64(m.HelloAck.Limits.MaxFrameBytes))
		e.varint(uint64(m.HelloAck.Limits.MaxFdsPerFrame))
		if m.HelloAck.ProtocolVersion >= featuresSince {
			e.varint(uint64(len(m.HelloAck.Features)))
			for _, name := range m.HelloAck.Features {
				e.bytes([]byte(name))
			}
		}
	case m.Spawned != nil:
		e.varint(1)
		e.varint(m.Spawned.ID)
		e.i32(m.Spawned.Pid)
		if v >= sandboxSince {
			e.appliedSandbox(m.Spawned.Sandbox)
		}
	case m.SpawnFailed != nil:
		e.varint(2)
		e.varint(m.SpawnFailed.ID)
		e.varint(uint64(m.SpawnFailed.Stage))
		e.i32(m.SpawnFailed.Errno)
		e.bytes([]byte(m.SpawnFailed.Message))
	case m.Exited != nil:
		x := m.Exited
		e.varint(3)
		e.varint(x.ID)
		switch {
		case x.Status.Exited != nil:
			e.varint(0)
			e.i32(*x.Status.Exited)
		case x.Status.Signaled != nil:
			e.varint(1)
			e.i32(x.Status.Signaled.Signal)
			e.boolean(x.Status.Signaled.CoreDumped)
		default:
			return nil, errors.New("ExitStatus has no variant set")
		}
		e.varint(x.Usage.UserMicros)
		e.varint(x.Usage.SystemMicros)
		e.varint(x.Usage.MaxRssKiB)
		e.boolean(x.TimedOut)
		if e.option(x.Tree != nil) {
			e.varint(x.Tree.UserMicros)
			e.varint(x.Tree.SystemMicros)
			e.optU64(x.Tree.MemoryPeakBytes)
			e.varint(x.Tree.OomKills)
			e.optU64(x.Tree.MemoryMax)
		}
		e.i32(x.Pid)
	case m.SignalSent != nil:
		e.varint(4)
		e.varint(m.SignalSent.ID)
	case m.RequestFailed != nil:
		e.varint(5)
		e.varint(m.RequestFailed.ID)
		e.i32(m.RequestFailed.Errno)
		e.bytes([]byte(m.RequestFailed.Message))
	case m.ProtocolError != nil:
		e.varint(6)
		e.varint(uint64(m.ProtocolError.Kind))
		e.bytes([]byte(m.ProtocolError.Message))
	case m.Status != nil:
		s := m.Status
		e.varint(7)
		e.varint(s.ID)
		e.bytes([]byte(s.ServerVersion))
		e.i32(s.Pid)
		for _, n := range []uint64{s.UptimeMillis, s.ConnectionsOpen, s.ConnectionsAccepted,
			s.ChildrenRunning, s.SpawnsSucceeded, s.SpawnsFailed} {
			e.varint(n)
		}
		if v >= sandboxSince {
			e.statusTail(s)
		}
	case m.Stopped != nil:
		e.varint(8)
		e.varint(m.Stopped.ID)
		e.i32(m.Stopped.Signal)
	case m.Continued != nil:
		e.varint(9)
		e.varint(m.Continued.ID)
	case m.TemplateReady != nil:
		r := m.TemplateReady
		e.varint(10)
		e.varint(r.ID)
		e.varint(r.Template)
		e.i32(r.Pid)
		e.boolean(r.Reused)
	case m.Templates != nil:
		e.varint(11)
		e.varint(m.Templates.ID)
		e.varint(uint64(len(m.Templates.Templates)))
		for _, t := range m.Templates.Templates {
			e.varint(t.Template)
			e.varint(uint64(t.UID))
			e.i32(t.Pid)
			e.bytes([]byte(t.Kind))
			e.bytes(t.Interpreter)
			e.strList(t.Preload)
			for _, n := range []uint64{t.Forks, t.Restarts, t.AgeMillis, t.RssBytes} {
				e.varint(n)
			}
		}
	default:
		return nil, errNoVariant
	}
	return e.b, nil
}

// spawn decodes a SpawnRequest in the layout of version v.
func (d *decoder) spawn(v uint32) *spawnRequest {
	r := &spawnRequest{ID: d.u64("id"), Program: d.bytes("program")}
	if d.option("argv0") {
		r.Argv0 = d.bytes("argv0")
	}
	n := d.count("args")
	r.Args = make([]bstr, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		r.Args = append(r.Args, d.bytes("arg"))
	}
	n = d.count("env")
	r.Env = make([]envVar, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		r.Env = append(r.Env, envVar{Key: d.bytes("env key"), Value: d.bytes("env value")})
	}
	if d.option("cwd") {
		r.Cwd = d.bytes("cwd")
	}
	r.Stdin, r.Stdout, r.Stderr = d.stdio("stdin"), d.stdio("stdout"), d.stdio("stderr")
	n = d.count("fd_mappings")
	r.FdMappings = make([]fdMapping, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		r.FdMappings = append(r.FdMappings, fdMapping{d.u32("attached_index"), d.i32("child_fd")})
	}
	r.NewSession = d.boolean("new_session")
	if d.option("process_group") {
		v := d.i32("process_group")
		r.ProcessGroup = &v
	}
	if d.option("umask") {
		v := d.u32("umask")
		r.Umask = &v
	}
	n = d.count("rlimits")
	r.Rlimits = make([]resourceLimit, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		r.Rlimits = append(r.Rlimits, resourceLimit{d.u32("resource"), d.u64("soft"), d.u64("hard")})
	}
	if d.option("user") {
		u := &userSpec{UID: d.u32("uid"), GID: d.u32("gid")}
		n = d.count("groups")
		u.Groups = make([]uint32, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			u.Groups = append(u.Groups, d.u32("group"))
		}
		r.User = u
	}
	if d.option("kill_on_close") {
		r.KillOnClose = &killOnClose{d.i32("signal"), d.boolean("process_group")}
	}
	if d.option("timeout") {
		r.Timeout = &timeoutSpec{d.u64("millis"), d.u64("grace_millis")}
	}
	if d.option("pty") {
		r.Pty = &ptySpec{windowSize{d.u16("rows"), d.u16("cols")}}
	}
	r.ReportStops = d.boolean("report_stops")
	if d.option("cgroup") {
		c := &cgroupSpec{KillTree: d.boolean("kill_tree"), WaitTree: d.boolean("wait_tree")}
		c.MemoryMax = d.optU64("memory_max")
		c.MemorySwapMax = d.optU64("memory_swap_max")
		c.PidsMax = d.optU64("pids_max")
		if d.option("cpu_max") {
			c.CPUMax = &cpuMax{d.u64("quota_micros"), d.u64("period_micros")}
		}
		c.CPUWeight = d.optU32("cpu_weight")
		c.IOWeight = d.optU32("io_weight")
		r.Cgroup = c
	}
	r.IgnoredSignals = d.u64("ignored_signals")
	if d.option("nice") {
		nice := d.i32("nice")
		r.Nice = &nice
	}
	n = d.count("cpu_affinity")
	r.CPUAffinity = make([]uint32, 0, n)
	for i := 0; i < n; i++ {
		r.CPUAffinity = append(r.CPUAffinity, d.u32("cpu"))
	}
	if d.option("oom_score_adj") {
		adj := d.i32("oom_score_adj")
		r.OomScoreAdj = &adj
	}
	if d.option("large_args") {
		index := d.u32("large_args")
		r.LargeArgs = &index
	}
	r.DeferSpawned = d.boolean("defer_spawned")
	if v >= sandboxSince {
		r.Sandbox = d.sandbox()
	}
	return r
}

// decodeClient decodes one client frame in the newest version's layout
// (used by the conformance tests).
func decodeClient(b []byte) (*clientMessage, error) { return decodeClientIn(b, protocolVersion) }

// decodeClientIn decodes one client frame in the layout of version v.
func decodeClientIn(b []byte, v uint32) (*clientMessage, error) {
	d := &decoder{b: b}
	m := &clientMessage{}
	variants := 5
	if v >= templatesSince {
		variants = 8
	}
	switch d.variant("ClientMessage", variants) {
	case 0:
		m.Hello = &hello{d.u32("protocol_version"), d.str("client")}
	case 1:
		m.Spawn = d.spawn(v)
	case 2:
		m.Signal = &signalRequest{d.u64("id"), d.u64("spawn_id"), d.i32("signal")}
	case 3:
		m.Status = &statusRequest{d.u64("id")}
	case 4:
		m.Upgrade = &upgradeRequest{d.u64("id")}
	case 5:
		r := &templateRequest{ID: d.u64("id"), Kind: d.str("kind"), Interpreter: d.bytes("interpreter"),
			Preload: d.strList("preload")}
		n := d.count("env")
		r.Env = make([]envVar, 0, n)
		for i := 0; i < n && d.err == nil; i++ {
			r.Env = append(r.Env, envVar{Key: d.bytes("env key"), Value: d.bytes("env value")})
		}
		if d.option("cwd") {
			r.Cwd = d.bytes("cwd")
		}
		m.Template = r
	case 6:
		r := &templateSpawnRequest{Template: d.u64("template")}
		r.Spawn = *d.spawn(v)
		m.SpawnFromTemplate = r
	case 7:
		m.ListTemplates = &templateListRequest{d.u64("id")}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}
