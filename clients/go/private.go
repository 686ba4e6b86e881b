package zygote

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// BinaryEnv names the environment variable that LaunchPrivate reads first
// to find the zygote binary.
const BinaryEnv = "ZYGOTE_BIN"

// FindBinary returns the zygote binary LaunchPrivate would start: $ZYGOTE_BIN,
// else "zygote" next to this program's executable, else on $PATH.
func FindBinary() (string, error) {
	var candidates []string
	if env := os.Getenv(BinaryEnv); env != "" {
		candidates = append(candidates, env)
	}
	exeDir := ""
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
		candidates = append(candidates, filepath.Join(exeDir, "zygote"))
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir != "" {
			candidates = append(candidates, filepath.Join(dir, "zygote"))
		}
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("zygote: no zygote binary found: set %s=/path/to/zygote, or install it next to this program (%s) or on PATH", BinaryEnv, exeDir)
}

// LaunchPrivate starts a zygote that serves only this process
// (`zygote serve --private-fd 0`, over a socketpair) and connects to it.
//
// Starting it is the one fork this program makes, through os/exec: do it
// early, while the program is still small, and then spawn everything
// through the returned Client. The zygote writes warnings to this
// program's stderr (set ZYGOTE_LOG for more). It exits once the Client is
// closed (or this program dies) and its children have been reaped; Close
// reaps it in the background. The Client cannot reconnect: if the private
// zygote dies, make a new one.
func LaunchPrivate() (*Client, error) {
	binary, err := FindBinary()
	if err != nil {
		return nil, err
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("zygote: creating the private zygote's socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "zygote-private-peer")
	cmd := exec.Command(binary, "serve", "--private-fd", "0")
	cmd.Stdin = theirs
	cmd.Stderr = os.Stderr
	if os.Getenv("ZYGOTE_LOG") == "" && os.Getenv("RUST_LOG") == "" {
		cmd.Env = append(os.Environ(), "ZYGOTE_LOG=warn")
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		syscall.Close(fds[0])
		return nil, fmt.Errorf("zygote: starting the private zygote %s: %w", binary, err)
	}
	sock, err := newSocket(fds[0])
	if err == nil {
		var conn *connection
		if conn, err = newConnection(sock, handshakeTimeout); err == nil {
			c := &Client{private: cmd.Process}
			c.cur.Store(conn)
			return c, nil
		}
	}
	_ = cmd.Process.Kill()
	_, _ = cmd.Process.Wait()
	return nil, fmt.Errorf("zygote: connecting to the private zygote %s: %w", binary, err)
}
