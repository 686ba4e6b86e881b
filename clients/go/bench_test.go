package zygote

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// cpuMeter reports this process's CPU time and context switches per
// operation (getrusage(RUSAGE_SELF)): the client's own cost, which the
// daemon's share and the machine's other load do not blur.
type cpuMeter struct{ ru syscall.Rusage }

func startCPU() *cpuMeter {
	m := &cpuMeter{}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &m.ru)
	return m
}

func (m *cpuMeter) report(b *testing.B) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano() - m.ru.Utime.Nano() - m.ru.Stime.Nano())
	n := float64(b.N)
	b.ReportMetric(float64(cpu.Microseconds())/n, "cpu-µs/op")
	b.ReportMetric(float64(ru.Nvcsw+ru.Nivcsw-m.ru.Nvcsw-m.ru.Nivcsw)/n, "ctxsw/op")
}

// BenchmarkRunTrue is one spawn of /bin/true and its wait, the client's
// per-spawn cost plus the daemon's: profile the client side with
// go test -run '^$' -bench RunTrue -cpuprofile cpu.out -benchmem.
func BenchmarkRunTrue(b *testing.B) {
	if sharedSocket == "" {
		b.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := Dial(sharedSocket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if err := c.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkRunTrueParallel is the same from GOMAXPROCS goroutines x 8.
func BenchmarkRunTrueParallel(b *testing.B) {
	if sharedSocket == "" {
		b.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := Dial(sharedSocket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	cpu := startCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Command("/bin/true").Run(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	cpu.report(b)
}

// BenchmarkBuildRequest is the client's work before the send: the
// request from the Cmd, and its encoding into a pooled buffer.
func BenchmarkBuildRequest(b *testing.B) {
	c := &Client{}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		cmd := c.Command("/bin/true")
		p, err := cmd.build(true)
		if err != nil {
			b.Fatal(err)
		}
		frame, err := encodeClientTo(getFrameBuf(), &clientMessage{Spawn: p.req}, protocolVersion)
		if err != nil {
			b.Fatal(err)
		}
		putFrameBuf(frame)
	}
}

// BenchmarkStatus is one round trip without a spawn: the client's and the
// daemon's messaging cost alone.
func BenchmarkStatus(b *testing.B) {
	if sharedSocket == "" {
		b.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	c, err := Dial(sharedSocket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if _, err := c.Status(); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkPythonWarm and BenchmarkPythonCold run `python3 -c pass`
// through the zygote: as a fork of a template that imported json, and as
// a cold spawn that imports json itself. Run both with
// go test -run '^$' -bench 'Python(Warm|Cold)$' -benchtime 200x.
func BenchmarkPythonWarm(b *testing.B) {
	c := benchTemplates(b)
	tmpl, err := c.PythonTemplate(context.Background(), TemplateOptions{Preload: []string{"json"}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if err := tmpl.Command("-c", "import json").Run(); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

func BenchmarkPythonCold(b *testing.B) {
	c := benchTemplates(b)
	python, err := exec.LookPath("python3")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if err := c.Command(python, "-c", "import json").Run(); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// benchTemplates connects to the shared daemon, which must offer
// templates, and needs python3.
func benchTemplates(b *testing.B) *Client {
	if sharedSocket == "" {
		b.Skip("SKIP: needs the zygote binary: set ZYGOTE_BIN")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		b.Skip("SKIP: needs python3 on PATH")
	}
	c, err := Dial(sharedSocket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if !c.Offers(featureTemplates) {
		b.Skipf("SKIP: the daemon does not offer templates (features %q)", c.Features())
	}
	return c
}
