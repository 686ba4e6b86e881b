package zygote

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// rlimitNofile is RLIMIT_NOFILE on Linux.
const rlimitNofile = 7

// rlimitCount is RLIM_NLIMITS: every resource getrlimit(2) knows.
const rlimitCount = 16

// processSettings are the process-wide settings a request copies so that
// the child looks as if this process had started it, as the Rust client
// does: the umask and the resource limits. They are read once per Client
// (see RefreshProcessState).
type processSettings struct {
	umask   *uint32
	rlimits []resourceLimit
}

func readProcessSettings() *processSettings {
	return &processSettings{umask: readUmask(), rlimits: readRlimits()}
}

// readUmask reads the umask from /proc/self/status: umask(2) can only read
// it by setting it, which would race with other goroutines creating files.
func readUmask() *uint32 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Umask:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(rest), 8, 32)
			if err != nil || v > 0o777 {
				return nil
			}
			mask := uint32(v)
			return &mask
		}
	}
	return nil
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

// RefreshProcessState rereads this process's umask and resource limits,
// which a Client reads at its first spawn and then copies into every
// request. Call it after changing either.
func (c *Client) RefreshProcessState() {
	s := readProcessSettings()
	c.settingsMu.Lock()
	c.settings = s
	c.settingsMu.Unlock()
}
