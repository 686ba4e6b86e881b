package zygote

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// rlimitNofile is RLIMIT_NOFILE on Linux.
const rlimitNofile = 7

// rlimitCount is RLIM_NLIMITS: every resource getrlimit(2) knows.
const rlimitCount = 16

// processSettings are the process-wide settings a request copies so that
// the child looks as if this process had started it, as the Rust client
// does: the umask, the resource limits, the ignored signals, the nice
// value, the CPU affinity and the OOM score adjustment. They are read once
// per Client (see RefreshProcessState).
type processSettings struct {
	umask          *uint32
	rlimits        []resourceLimit
	ignoredSignals uint64
	nice           *int32
	cpuAffinity    []uint32
	oomScoreAdj    *int32
	// rlimitsEncoded is rlimits encoded, for the requests that copy
	// them unchanged.
	rlimitsEncoded []byte
}

func readProcessSettings() *processSettings {
	status, _ := os.ReadFile("/proc/self/status")
	s := &processSettings{
		umask:          parseUmask(string(status)),
		rlimits:        readRlimits(),
		ignoredSignals: parseIgnored(string(status)),
		nice:           readNice(),
		cpuAffinity:    readAffinity(),
		oomScoreAdj:    readOomScoreAdj(),
	}
	e := &encoder{}
	e.rlimits(s.rlimits)
	s.rlimitsEncoded = e.b
	return s
}

// statusField is the value of a "Name:" line of /proc/self/status.
func statusField(status, name string) (string, bool) {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// parseUmask reads the umask from /proc/self/status: umask(2) can only
// read it by setting it, which would race with other goroutines creating
// files.
func parseUmask(status string) *uint32 {
	value, ok := statusField(status, "Umask:")
	if !ok {
		return nil
	}
	v, err := strconv.ParseUint(value, 8, 32)
	if err != nil || v > 0o777 {
		return nil
	}
	mask := uint32(v)
	return &mask
}

// parseIgnored is the SigIgn mask: the signals this process ignores,
// which os/exec's children inherit ignored too (the Go runtime resets the
// signals it handles, SIGPIPE among them, and leaves the ignored ones).
func parseIgnored(status string) uint64 {
	value, ok := statusField(status, "SigIgn:")
	if !ok {
		return 0
	}
	mask, err := strconv.ParseUint(value, 16, 64)
	if err != nil {
		return 0
	}
	return mask
}

// readNice is the calling thread's nice value, which a child forked from
// it would inherit (nice is per thread on Linux).
func readNice() *int32 {
	// The raw syscall returns 20 - nice, so that it is never negative.
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return nil
	}
	nice := int32(20 - prio)
	return &nice
}

// readAffinity lists the CPUs the calling thread may run on.
func readAffinity() []uint32 {
	var mask [1024 / 64]uint64 // the kernel's default CONFIG_NR_CPUS bound
	n, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
	if errno != 0 {
		return nil
	}
	var cpus []uint32
	for i := 0; i < int(n)*8 && i < len(mask)*64; i++ {
		if mask[i/64]&(1<<(i%64)) != 0 {
			cpus = append(cpus, uint32(i))
		}
	}
	return cpus
}

// readOomScoreAdj is this process's OOM score adjustment.
func readOomScoreAdj() *int32 {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return nil
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 32)
	if err != nil {
		return nil
	}
	adj := int32(v)
	return &adj
}

// readRlimits reads every resource limit of this process.
//
// The Go runtime raises its own soft RLIMIT_NOFILE to the hard limit minus
// one at start (Go 1.22 raises it to the hard limit itself: then there is
// no mark to see and the raised limit is copied), and os/exec gives children the original soft limit back,
// which this process cannot read. When the soft limit carries that mark,
// the request leaves RLIMIT_NOFILE out, so the child gets the zygote's own
// soft limit (capped at this process's hard limit by the daemon), as old
// select(2)-based programs expect; otherwise it is copied like the rest.
func readRlimits() []resourceLimit {
	out := make([]resourceLimit, 0, rlimitCount)
	for r := 0; r < rlimitCount; r++ {
		var l syscall.Rlimit
		if err := syscall.Getrlimit(r, &l); err != nil {
			continue
		}
		if r == rlimitNofile && l.Max > 0 && l.Max != ^uint64(0) && l.Cur == l.Max-1 {
			continue
		}
		out = append(out, resourceLimit{Resource: uint32(r), Soft: l.Cur, Hard: l.Max})
	}
	return out
}

func (c *Client) processSettings() *processSettings {
	c.settingsMu.Lock()
	defer c.settingsMu.Unlock()
	if c.settings == nil {
		c.settings = readProcessSettings()
	}
	return c.settings
}

// RefreshProcessState rereads this process's umask, resource limits,
// ignored signals, nice value, CPU affinity and OOM score adjustment,
// which a Client reads at its first spawn and then copies into every
// request. Call it after changing any of them. The nice value and the
// affinity are per thread on Linux: they are read on the calling thread.
func (c *Client) RefreshProcessState() {
	s := readProcessSettings()
	c.settingsMu.Lock()
	c.settings = s
	c.settingsMu.Unlock()
}
