package zygote

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A cgroup per child for the Go client, against a daemon with a cgroup subtree of
// its own (zygote serve --cgroup): whole-tree kill, tree-wide accounting,
// and limits refused where the kernel cannot enforce them.

// testCgroup creates a cgroup v2 directory for one test's daemon, or
// skips loudly where there is none to write; at cleanup whatever is left
// in it is killed and the tree removed.
func testCgroup(t *testing.T) string {
	t.Helper()
	mount := cgroup2Mount()
	if mount == "" {
		t.Skip("SKIP: no cgroup2 file system mounted")
	}
	if _, err := os.Stat(filepath.Join(mount, "cgroup.procs")); err != nil || os.Geteuid() != 0 {
		t.Skipf("SKIP: cgroup2 at %s is not writable here (needs root)", mount)
	}
	dir := filepath.Join(mount, fmt.Sprintf("zygote-go-test-%s-%d", strings.ToLower(t.Name()), os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		t.Skip("SKIP: no cgroup.kill (needs Linux 5.14)")
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		settle(func() bool {
			events, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			return strings.Contains(string(events), "populated 0")
		})
		removeTree(dir)
	})
	return dir
}

func removeTree(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeTree(filepath.Join(dir, e.Name()))
		}
	}
	os.Remove(dir)
}

func cgroup2Mount() string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		before, after, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		if f := strings.Fields(after); len(f) > 0 && f[0] == "cgroup2" {
			if b := strings.Fields(before); len(b) > 4 {
				return b[4]
			}
		}
	}
	return ""
}

// childCgroups lists the per-child cgroups under peers/<uid>/.
func childCgroups(root string) []string {
	var found []string
	uids, _ := os.ReadDir(filepath.Join(root, "peers"))
	for _, uid := range uids {
		children, _ := os.ReadDir(filepath.Join(root, "peers", uid.Name()))
		for _, child := range children {
			if child.IsDir() {
				found = append(found, filepath.Join(root, "peers", uid.Name(), child.Name()))
			}
		}
	}
	return found
}

// gone: not even a zombie, so the daemon, a subreaper, reaped it.
func gone(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err != nil
}

// startEscaping starts a shell whose grandchild double-forks and setsids,
// leaving the child's process group and session, and returns that
// grandchild's pid.
func startEscaping(t *testing.T, cmd *Cmd) int {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the grandchild's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

const escapingScript = "(setsid sh -c 'echo $$; exec sleep 300' &); exec sleep 300"

func TestCgroupTimeoutKillsEscapedGrandchild(t *testing.T) {
	root := testCgroup(t)
	d := ownDaemon(t, "--cgroup", root)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := c.Command("/bin/sh", "-c", escapingScript)
	cmd.Zygote.Timeout = 300 * time.Millisecond
	cmd.Zygote.TimeoutGrace = 200 * time.Millisecond
	cmd.Zygote.Cgroup = &CgroupOptions{KillTree: true}
	grandchild := startEscaping(t, cmd)
	defer syscall.Kill(grandchild, syscall.SIGKILL)
	if gone(grandchild) {
		t.Fatal("the grandchild does not run")
	}
	err = cmd.Wait()
	var ee *ExitError
	if !errors.As(err, &ee) || !ee.TimedOut() {
		t.Fatalf("Wait: %v, want a timed-out ExitError", err)
	}
	if ee.TreeUsage() == nil {
		t.Error("no tree usage for a command with a cgroup option")
	}
	if !settle(func() bool { return gone(grandchild) }) {
		t.Errorf("the setsid grandchild %d outlived the timeout", grandchild)
	}
	if !settle(func() bool { return len(childCgroups(root)) == 0 }) {
		t.Errorf("cgroups left: %v", childCgroups(root))
	}
}

func TestCgroupKillTreeOnProcessKill(t *testing.T) {
	root := testCgroup(t)
	d := ownDaemon(t, "--cgroup", root)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := c.Command("/bin/sh", "-c", escapingScript)
	cmd.Zygote.Cgroup = &CgroupOptions{KillTree: true}
	grandchild := startEscaping(t, cmd)
	defer syscall.Kill(grandchild, syscall.SIGKILL)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var ee *ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait after Kill: %v", err)
	}
	if !settle(func() bool { return gone(grandchild) }) {
		t.Errorf("the setsid grandchild %d outlived Process.Kill", grandchild)
	}
}

func TestCgroupKillOnCloseKillsEscapedGrandchild(t *testing.T) {
	root := testCgroup(t)
	d := ownDaemon(t, "--cgroup", root)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.Command("/bin/sh", "-c", escapingScript)
	cmd.Zygote.KillOnClose = syscall.SIGKILL
	cmd.Zygote.Cgroup = &CgroupOptions{KillTree: true}
	grandchild := startEscaping(t, cmd)
	defer syscall.Kill(grandchild, syscall.SIGKILL)
	if n := len(childCgroups(root)); n != 1 {
		t.Errorf("%d child cgroups, want 1", n)
	}
	c.Close()
	if err := cmd.Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close: %v", err)
	}
	if !settle(func() bool { return gone(grandchild) }) {
		t.Errorf("the setsid grandchild %d outlived kill-on-close", grandchild)
	}
	if !settle(func() bool { return len(childCgroups(root)) == 0 }) {
		t.Errorf("cgroups left: %v", childCgroups(root))
	}
}

func TestCgroupTreeCPUCountsGrandchild(t *testing.T) {
	root := testCgroup(t)
	d := ownDaemon(t, "--cgroup", root)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The child exits at once; its orphaned grandchild burns CPU after.
	burn := "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
	cmd := c.Command("/bin/sh", "-c", "(sh -c '"+burn+"' &); exit 0")
	cmd.Zygote.Cgroup = &CgroupOptions{WaitTree: true}
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	tree := cmd.ProcessState.TreeUsage()
	if tree == nil {
		t.Fatal("no tree usage in the exit notice")
	}
	own := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if treeCPU := tree.UserTime + tree.SystemTime; treeCPU < own+50*time.Millisecond {
		t.Errorf("tree CPU %v should exceed the child's own %v by the grandchild's work", treeCPU, own)
	}
	if tree.OOMKills != 0 || cmd.ProcessState.OOMKilled() {
		t.Errorf("OOM kills %d", tree.OOMKills)
	}
}

func TestCgroupLimitWithoutControllerIsRefused(t *testing.T) {
	root := testCgroup(t)
	d := ownDaemon(t, "--cgroup", root)
	c, err := Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	controllers, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	delegated := strings.Contains(" "+string(controllers)+" ", " memory ")
	if !delegated {
		cmd := c.Command("true")
		cmd.Zygote.Cgroup = &CgroupOptions{MemoryMax: 512 << 20}
		err := cmd.Run()
		var se *StartError
		if !errors.As(err, &se) || se.Stage != "Cgroup" ||
			!strings.Contains(err.Error(), "memory.max requested") || !strings.Contains(err.Error(), "memory controller is not delegated") {
			t.Errorf("memory.max without the controller: %v", err)
		}
		if left := childCgroups(root); len(left) != 0 {
			t.Errorf("a refused spawn left cgroups: %v", left)
		}
	}
	// The connection carries on.
	if err := c.Command("true").Run(); err != nil {
		t.Error(err)
	}
	if delegated {
		t.Skip("SKIP part: the memory controller is delegated here, the refusal is not reachable")
	}
}

func TestCgroupOptionsWithoutSubtreeAreRefused(t *testing.T) {
	own, _ := os.ReadFile("/proc/self/cgroup")
	unified := ""
	for _, line := range strings.Split(string(own), "\n") {
		if v, ok := strings.CutPrefix(line, "0::"); ok {
			unified = v
		}
	}
	if unified != "/" {
		t.Skipf("SKIP: this process is in cgroup2 %q, which a daemon without --cgroup may take as its subtree", unified)
	}
	c := dial(t)
	cmd := c.Command("true")
	cmd.Zygote.Cgroup = &CgroupOptions{PidsMax: 10}
	if err := cmd.Run(); err == nil || !strings.Contains(err.Error(), "no cgroup subtree") {
		t.Errorf("a cgroup option without a subtree: %v", err)
	}
}

func TestOOMKillIsReportedAsSuch(t *testing.T) {
	// No memory controller here to provoke one: the daemon's exit notice
	// of an OOM-killed tree as it sends it, the shared vector's bytes.
	data, err := os.ReadFile(filepath.Join("..", "..", "proto", "vectors", "frames.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file vectorFile
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var frame []byte
	for _, v := range file.Vectors {
		if v.Name == "exited_tree" {
			if frame, err = hex.DecodeString(v.Hex); err != nil {
				t.Fatal(err)
			}
		}
	}
	m, err := decodeServer(frame)
	if err != nil || m.Exited == nil {
		t.Fatalf("the exited_tree vector: %+v, %v", m, err)
	}
	st := newProcessState(4242, m.Exited)
	if !st.OOMKilled() || st.String() != "signal: killed (killed by the OOM killer: memory.max 536870912)" {
		t.Errorf("OOMKilled %v, %q", st.OOMKilled(), st.String())
	}
	if st.TreeUsage().UserTime != time.Second || st.TreeUsage().MemoryMax != 512<<20 {
		t.Errorf("tree usage %+v", st.TreeUsage())
	}
}

func TestCgroupOptionsSpec(t *testing.T) {
	o := &CgroupOptions{KillTree: true, MemoryMax: 1 << 30, PidsMax: 64, CPUQuota: 50 * time.Millisecond, CPUWeight: 200}
	s := o.spec()
	if !s.KillTree || s.WaitTree || *s.MemoryMax != 1<<30 || s.MemorySwapMax != nil || *s.PidsMax != 64 ||
		*s.CPUMax != (cpuMax{QuotaMicros: 50000, PeriodMicros: 100000}) || *s.CPUWeight != 200 || s.IOWeight != nil {
		t.Errorf("spec %+v", s)
	}
}
