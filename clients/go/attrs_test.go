package zygote

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// childAttributes runs the probe with run and returns what the child saw:
// its nice value, OOM score adjustment, ignored signals and CPUs.
func childAttributes(t *testing.T, run func() ([]byte, error)) map[string]string {
	t.Helper()
	out, err := run()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	text := string(out)
	got := map[string]string{}
	stat, rest, _ := strings.Cut(text, "\n")
	if i := strings.LastIndexByte(stat, ')'); i >= 0 {
		// Field 19 is the nice value; fields after the comm start at 3.
		if fields := strings.Fields(stat[i+1:]); len(fields) > 16 {
			got["nice"] = fields[16]
		}
	}
	adj, rest, _ := strings.Cut(rest, "\n")
	got["oom_score_adj"] = adj
	for _, line := range strings.Split(rest, "\n") {
		for _, key := range []string{"SigIgn", "Cpus_allowed_list"} {
			if v, ok := strings.CutPrefix(line, key+":"); ok {
				got[key] = strings.TrimSpace(v)
			}
		}
	}
	return got
}

const attributesProbe = "cat /proc/self/stat /proc/self/oom_score_adj /proc/self/status"

func TestProcessAttributesAreTransparent(t *testing.T) {
	c := dial(t)
	// Nice and affinity are per thread: set them on this one, from which
	// the Client reads them and os/exec forks.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, 7); err != nil {
		t.Fatalf("setpriority: %v", err)
	}
	defer syscall.Setpriority(syscall.PRIO_PROCESS, 0, 0)

	oldAdj, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("300"), 0); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile("/proc/self/oom_score_adj", oldAdj, 0)

	signal.Ignore(syscall.SIGUSR2)
	defer signal.Reset(syscall.SIGUSR2)

	var oldMask [16]uint64
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(oldMask), uintptr(unsafe.Pointer(&oldMask[0]))); errno != 0 {
		t.Fatal(errno)
	}
	pinned := runtime.NumCPU() > 1
	if pinned {
		one := [16]uint64{1} // CPU 0 only
		if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(one), uintptr(unsafe.Pointer(&one[0]))); errno != 0 {
			t.Fatal(errno)
		}
		defer syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(oldMask), uintptr(unsafe.Pointer(&oldMask[0])))
	}

	c.RefreshProcessState()
	got := childAttributes(t, c.Command("sh", "-c", attributesProbe).Output)
	want := childAttributes(t, exec.Command("sh", "-c", attributesProbe).Output)

	if got["nice"] != "7" || got["oom_score_adj"] != "300" {
		t.Errorf("nice %q, oom_score_adj %q; want 7 and 300", got["nice"], got["oom_score_adj"])
	}
	const usr2 = 1 << (12 - 1)
	if ign, _ := hexMask(got["SigIgn"]); ign&usr2 == 0 {
		t.Errorf("SigIgn %q lacks SIGUSR2", got["SigIgn"])
	}
	if pinned && got["Cpus_allowed_list"] != "0" {
		t.Errorf("Cpus_allowed_list %q, want 0", got["Cpus_allowed_list"])
	}
	// What os/exec's child sees, the zygote's child sees.
	for _, key := range []string{"nice", "oom_score_adj", "SigIgn", "Cpus_allowed_list"} {
		if got[key] != want[key] {
			t.Errorf("%s: zygote child %q, os/exec child %q", key, got[key], want[key])
		}
	}

	// After RefreshProcessState the restored values apply again.
	syscall.Setpriority(syscall.PRIO_PROCESS, 0, 0)
	c.RefreshProcessState()
	if got := childAttributes(t, c.Command("sh", "-c", attributesProbe).Output); got["nice"] != "0" {
		t.Errorf("after a refresh: nice %q, want 0", got["nice"])
	}
	if !pinned {
		t.Skip("SKIP part: one CPU only, the affinity cannot differ from the daemon's")
	}
}

func hexMask(s string) (uint64, error) {
	var v uint64
	for _, c := range s {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint64(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint64(c-'a') + 10
		default:
			return 0, syscall.EINVAL
		}
	}
	return v, nil
}
