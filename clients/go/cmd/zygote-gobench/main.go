// Command zygote-gobench measures spawning /bin/true from Go: os/exec
// against the zygote Go client (a shared daemon, and a private one), from
// a live heap of 0 or more GiB, with extra open fds, at concurrency 1 and
// more. Rounds interleave the methods, and each cell reports p50, p99,
// max and spawns/s with ratios to os/exec in the same round. At
// concurrency 1 it adds the posix_spawn floor, a C helper compiled with cc
// at start, as zygote-bench does. The CPU columns are per spawn, from the
// process CPU clocks of this program and of the zygote that served it
// (os/exec's children are not counted: their time before exec is theirs).
//
//	ZYGOTE_BIN=target/release/zygote go run ./cmd/zygote-gobench -heap-gib 0,4
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	zygote "example.invalid/zygote/clients/go"
)

// floorC runs N posix_spawn + waitpid of PROGRAM for each "PROGRAM N"
// line and prints the latencies in ns on one line.
const floorC = `
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(void) {
    char path[4096];
    int n;
    while (scanf("%4095s %d", path, &n) == 2) {
        char *argv[] = {path, NULL};
        for (int i = 0; i < n; i++) {
            pid_t pid;
            int status;
            long long t0 = now();
            if (posix_spawn(&pid, path, NULL, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) != pid) {
                printf("error\n");
                fflush(stdout);
                return 1;
            }
            printf("%lld ", now() - t0);
        }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
`

type floor struct {
	in  *os.File
	out *bufio.Reader
}

func startFloor(dir string) (*floor, error) {
	src := filepath.Join(dir, "floor.c")
	bin := filepath.Join(dir, "floor")
	if err := os.WriteFile(src, []byte(floorC), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("cc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("compiling the floor helper with cc: %v: %s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &floor{in: stdin.(*os.File), out: bufio.NewReader(stdout)}, nil
}

func (f *floor) run(program string, n int) ([]time.Duration, time.Duration, error) {
	start := time.Now()
	if _, err := fmt.Fprintf(f.in, "%s %d\n", program, n); err != nil {
		return nil, 0, err
	}
	line, err := f.out.ReadString('\n')
	if err != nil {
		return nil, 0, err
	}
	wall := time.Since(start)
	var lat []time.Duration
	for _, field := range strings.Fields(line) {
		ns, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("floor helper said %q", line)
		}
		lat = append(lat, time.Duration(ns))
	}
	return lat, wall, nil
}

// ballast is the live heap, touched so that every page is resident.
var ballast [][]byte

func setHeap(gib int) {
	ballast = nil
	runtime.GC()
	for i := 0; i < gib*16; i++ {
		chunk := make([]byte, 64<<20)
		for j := 0; j < len(chunk); j += 4096 {
			chunk[j] = 1
		}
		ballast = append(ballast, chunk)
	}
}

// extraFds holds open fds as a busy server holds sockets.
var extraFds []int

func setFds(n int) error {
	for _, fd := range extraFds {
		syscall.Close(fd)
	}
	extraFds = extraFds[:0]
	for i := 0; i < n; i++ {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening extra fd %d of %d: %w", i, n, err)
		}
		extraFds = append(extraFds, fd)
	}
	return nil
}

type cell struct {
	lat []time.Duration
	// When each spawn began, from the cell's start (for -order).
	began []time.Duration
	wall  time.Duration
	// CPU time of this process and of the zygote (0: none) over the cell.
	cpu, zygoteCPU time.Duration
}

// processCPU is the CPU time of process pid (0: this one), all its
// threads, from its CPU clock (clock_getcpuclockid(3)).
func processCPU(pid int) time.Duration {
	clock := uintptr(2) // CLOCK_PROCESS_CPUTIME_ID
	if pid != 0 {
		clock = uintptr(^pid<<3 | 2) // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
	}
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clock, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// measure runs n spawns of spawn with c goroutines; zygotePid is the
// zygote serving them, or 0.
func measure(n, c int, zygotePid int, spawn func() error) (cell, error) {
	lat := make([]time.Duration, n)
	began := make([]time.Duration, n)
	var next int
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	cpu0, zcpu0 := processCPU(0), time.Duration(0)
	if zygotePid != 0 {
		zcpu0 = processCPU(zygotePid)
	}
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				t0 := time.Now()
				err := spawn()
				lat[i] = time.Since(t0)
				began[i] = t0.Sub(start)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	res := cell{lat: lat, began: began, wall: time.Since(start), cpu: processCPU(0) - cpu0}
	if zygotePid != 0 {
		res.zygoteCPU = processCPU(zygotePid) - zcpu0
	}
	return res, firstErr
}

type summary struct{ p50, p99, max, rate, cpuUs, zygoteCPUUs float64 }

func summarize(cs []cell) summary {
	var all []time.Duration
	var wall, cpu, zcpu time.Duration
	for _, c := range cs {
		all = append(all, c.lat...)
		wall += c.wall
		cpu += c.cpu
		zcpu += c.zygoteCPU
	}
	perSpawn := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(len(all)) }
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	q := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return summary{ms(q(0.50)), ms(q(0.99)), ms(all[len(all)-1]), float64(len(all)) / wall.Seconds(), perSpawn(cpu), perSpawn(zcpu)}
}

// orderStats tells a tail that comes from the order in which spawns are
// served from one that comes from the rate at which they complete.
type orderStats struct {
	// p99InOrder is the p99 had spawns ended in the order they began: the
	// i-th start of a round paired with its i-th end.
	p99InOrder float64
	// overtakenP99 is the p99 of how many spawns that began later ended
	// first.
	overtakenP99 int
	// burstCV is the coefficient of variation of completions per 5 ms:
	// near 0 for a steady stream, above 1 when they come in bursts.
	burstCV float64
}

func order(cs []cell) orderStats {
	const bin = 5 * time.Millisecond
	var inOrder []time.Duration
	var overtaken []int
	var counts []float64
	for _, c := range cs {
		n := len(c.lat)
		starts := slices.Clone(c.began)
		ends := make([]time.Duration, n)
		for i := range c.lat {
			ends[i] = c.began[i] + c.lat[i]
		}
		for i := 0; i < n; i++ {
			k := 0
			for j := 0; j < n; j++ {
				if starts[j] > starts[i] && ends[j] < ends[i] {
					k++
				}
			}
			overtaken = append(overtaken, k)
		}
		sortedEnds := slices.Clone(ends)
		slices.Sort(starts)
		slices.Sort(sortedEnds)
		for i := range starts {
			inOrder = append(inOrder, sortedEnds[i]-starts[i])
		}
		// Whole bins only: the last one is cut short by the round's end.
		perBin := make([]float64, int(c.wall/bin))
		for _, t := range ends {
			if b := int(t / bin); b < len(perBin) {
				perBin[b]++
			}
		}
		counts = append(counts, perBin...)
	}
	var st orderStats
	if len(inOrder) == 0 {
		return st
	}
	slices.Sort(inOrder)
	slices.Sort(overtaken)
	q := func(n int) int { return min(n-1, int(0.99*float64(n))) }
	st.p99InOrder = float64(inOrder[q(len(inOrder))]) / 1e6
	st.overtakenP99 = overtaken[q(len(overtaken))]
	if len(counts) > 1 {
		var sum, sq float64
		for _, v := range counts {
			sum += v
		}
		mean := sum / float64(len(counts))
		for _, v := range counts {
			sq += (v - mean) * (v - mean)
		}
		if mean > 0 {
			st.burstCV = math.Sqrt(sq/float64(len(counts))) / mean
		}
	}
	return st
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			log.Fatalf("bad number %q", f)
		}
		out = append(out, v)
	}
	return out
}

func main() {
	heaps := flag.String("heap-gib", "0,4", "live heap sizes in GiB")
	fdsFlag := flag.String("fds", "0,19000", "extra open fds")
	concFlag := flag.String("concurrency", "1,50", "goroutines spawning at once")
	rounds := flag.Int("rounds", 3, "interleaved rounds per cell")
	perRound := flag.Int("spawns", 2000, "spawns per method per round")
	socket := flag.String("socket", "", "a running zygote's socket (default: start one from ZYGOTE_BIN)")
	program := flag.String("program", "/bin/true", "program to spawn")
	orderFlag := flag.Bool("order", false, "also print, per cell of concurrency > 1, whether the tail comes from the order of service or from bursts of completions")
	flag.Parse()

	// While the program is small: the private zygote, the shared one if
	// asked to start it, and the floor helper.
	dir, err := os.MkdirTemp("", "zygote-gobench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	fl, err := startFloor(dir)
	if err != nil {
		log.Fatal(err)
	}
	private, err := zygote.LaunchPrivate()
	if err != nil {
		log.Fatal(err)
	}
	if *socket == "" {
		bin, err := zygote.FindBinary()
		if err != nil {
			log.Fatal(err)
		}
		*socket = filepath.Join(dir, "zygote.sock")
		d := exec.Command(bin, "serve", "--socket", *socket)
		d.Env = append(os.Environ(), "ZYGOTE_LOG=warn")
		d.Stderr = os.Stderr
		if err := d.Start(); err != nil {
			log.Fatal(err)
		}
		defer func() { _ = d.Process.Signal(syscall.SIGTERM); _ = d.Wait() }()
		for i := 0; ; i++ {
			if _, err := os.Stat(*socket); err == nil {
				break
			}
			if i > 500 {
				log.Fatal("the shared zygote did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	shared, err := zygote.Dial(*socket)
	if err != nil {
		log.Fatal(err)
	}

	zygotePid := func(c *zygote.Client) int {
		st, err := c.Status()
		if err != nil {
			log.Fatal(err)
		}
		return st.Pid
	}
	methods := []struct {
		name  string
		pid   int // the zygote's, for its CPU time
		spawn func() error
	}{
		{"os/exec", 0, func() error { return exec.Command(*program).Run() }},
		{"zygote shared", zygotePid(shared), func() error { return shared.Command(*program).Run() }},
		{"zygote private", zygotePid(private), func() error { return private.Command(*program).Run() }},
	}

	began := time.Now()
	fmt.Printf("%d rounds x %d spawns of %s per method and cell; GOMAXPROCS %d; %s\n\n",
		*rounds, *perRound, *program, runtime.GOMAXPROCS(0), runtime.Version())
	type key struct {
		heap, fds, c int
		method       string
	}
	results := map[key]summary{}
	var orderRows []string
	fmt.Println("| heap | fds | c | method | p50 ms | p99 ms | max ms | spawns/s | p50 / os/exec | p99 / os/exec | spawns/s / os/exec | p50 / floor | client cpu µs | zygote cpu µs |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, heap := range ints(*heaps) {
		setHeap(heap)
		for _, nfds := range ints(*fdsFlag) {
			if err := setFds(nfds); err != nil {
				log.Fatal(err)
			}
			for _, c := range ints(*concFlag) {
				cells := make([][]cell, len(methods))
				var floorCells []cell
				for r := 0; r < *rounds; r++ {
					if c == 1 {
						lat, wall, err := fl.run(*program, *perRound)
						if err != nil {
							log.Fatal(err)
						}
						floorCells = append(floorCells, cell{lat: lat, wall: wall})
					}
					for i, m := range methods {
						res, err := measure(*perRound, c, m.pid, m.spawn)
						if err != nil {
							log.Fatalf("%s: %v", m.name, err)
						}
						cells[i] = append(cells[i], res)
					}
				}
				base := summarize(cells[0])
				var fs summary
				if c == 1 {
					fs = summarize(floorCells)
					results[key{heap, nfds, c, "floor"}] = fs
					fmt.Printf("| %d GiB | %d | %d | posix_spawn floor | %.2f | %.2f | %.2f | %.0f | | | | 1.00 | | |\n",
						heap, nfds, c, fs.p50, fs.p99, fs.max, fs.rate)
				}
				for i, m := range methods {
					s := summarize(cells[i])
					results[key{heap, nfds, c, m.name}] = s
					vsFloor := ""
					if c == 1 {
						vsFloor = fmt.Sprintf("%.2f", s.p50/fs.p50)
					}
					zcpu := ""
					if m.pid != 0 {
						zcpu = fmt.Sprintf("%.0f", s.zygoteCPUUs)
					}
					fmt.Printf("| %d GiB | %d | %d | %s | %.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f | %s | %.0f | %s |\n",
						heap, nfds, c, m.name, s.p50, s.p99, s.max, s.rate, s.p50/base.p50, s.p99/base.p99, s.rate/base.rate, vsFloor, s.cpuUs, zcpu)
					if *orderFlag && c > 1 {
						o := order(cells[i])
						orderRows = append(orderRows, fmt.Sprintf("| %d GiB | %d | %d | %s | %.2f | %.2f | %d | %.2f |",
							heap, nfds, c, m.name, s.p99, o.p99InOrder, o.overtakenP99, o.burstCV))
					}
				}
			}
		}
	}
	if len(orderRows) > 0 {
		fmt.Println("\nOrder of service (-order): the p99 had spawns ended in the order they began, how many that began later ended first (p99), and the coefficient of variation of completions per 5 ms (above 1: bursts)")
		fmt.Println()
		fmt.Println("| heap | fds | c | method | p99 ms | p99 in order ms | overtaken p99 | completions / 5 ms CV |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
		for _, row := range orderRows {
			fmt.Println(row)
		}
	}
	_ = setFds(0)
	shared.Close()
	private.Close()

	// The targets, from the largest heap with the fewest fds.
	heap, nfds := slices.Max(ints(*heaps)), slices.Min(ints(*fdsFlag))
	cMax := slices.Max(ints(*concFlag))
	fmt.Printf("\nTargets (from %d GiB, %d extra fds); run time %v\n\n", heap, nfds, time.Since(began).Round(time.Second))
	fmt.Println("| target | method | measured | goal | result |")
	fmt.Println("|---|---|---|---|---|")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	for _, m := range []string{"zygote shared", "zygote private"} {
		if cMax > 1 {
			base, ok1 := results[key{heap, nfds, cMax, "os/exec"}]
			z, ok2 := results[key{heap, nfds, cMax, m}]
			if ok1 && ok2 {
				fmt.Printf("| c=%d p99 / os/exec p99 | %s | %.2f | <= 0.50 | %s |\n", cMax, m, z.p99/base.p99, verdict(z.p99 <= base.p99/2))
				fmt.Printf("| c=%d spawns/s / os/exec | %s | %.2f | >= 1.00 | %s |\n", cMax, m, z.rate/base.rate, verdict(z.rate >= base.rate))
			}
		}
		fl, ok1 := results[key{heap, nfds, 1, "floor"}]
		z, ok2 := results[key{heap, nfds, 1, m}]
		if ok1 && ok2 {
			fmt.Printf("| c=1 p50 / posix_spawn floor | %s | %.2f | <= 1.30 | %s |\n", m, z.p50/fl.p50, verdict(z.p50 <= 1.3*fl.p50))
		}
	}
}
