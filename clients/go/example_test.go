package zygote_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os/exec"
	"syscall"
	"time"

	zygote "example.invalid/zygote/clients/go"
)

// The README's example: os/exec's shapes, without a fork.
func Example() {
	client, err := zygote.DialDefault() // $ZYGOTE_SOCKET, or the default path
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// exec.Command(...) becomes client.Command(...).
	out, err := client.Command("echo", "hello from the zygote").Output()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))

	// Contexts kill the child as in os/exec; Cmd.Zygote has the zygote's
	// own options, such as a kill that also fires if this program dies.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	cmd := client.CommandContext(ctx, "sleep", "10")
	cmd.Zygote.KillOnClose = syscall.SIGKILL
	cmd.Zygote.Timeout = time.Minute
	err = cmd.Run()
	var exitErr *zygote.ExitError
	if errors.As(err, &exitErr) {
		fmt.Println(exitErr, exitErr.ExitCode())
	}

	// Failures to start carry the errno and the step that failed.
	err = client.Command("no-such-program").Run()
	fmt.Println(errors.Is(err, exec.ErrNotFound), errors.Is(err, syscall.ENOENT))
	// Output:
	// hello from the zygote
	// signal: killed -1
	// true true
}

// A warm template: the README's example. Each child is a fork of a
// python3 that has imported json and decimal, as `python3 -c CODE ARGS`
// would run.
func ExampleClient_PythonTemplate() {
	client, err := zygote.DialDefault()
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	tmpl, err := client.PythonTemplate(ctx, zygote.TemplateOptions{Preload: []string{"json", "decimal"}})
	if errors.Is(err, syscall.EOPNOTSUPP) {
		fmt.Println("no templates here:", err) // refused before anything was sent
		return
	}
	if err != nil {
		log.Fatal(err) // a *zygote.TemplateError: a preload's traceback, a missing python3...
	}
	cmd := tmpl.CommandContext(ctx, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", "a", "b")
	cmd.Dir = "/tmp"
	out, err := cmd.Output()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out)) // ["a", "b"]
}
