// Package zygote runs child processes through a zygote spawn server, so
// that a Go program never forks: a Go server with a large heap and many
// goroutines starts children with the latency of a small process, without
// os/exec's fork from the big heap or its ForkLock.
//
// The API reads like os/exec. Change
//
//	cmd := exec.Command("git", "log")
//
// to
//
//	cmd := client.Command("git", "log")
//
// where client comes from Dial, DialDefault or LaunchPrivate. Cmd has
// os/exec's fields and methods (Run, Start, Wait, Output, CombinedOutput,
// the pipes, Cancel and WaitDelay), Cmd.Process can be signalled and
// carries the child's pidfd, and Cmd.ProcessState has the exit status and
// the resource usage. One Client may be used by any number of goroutines:
// their spawns are multiplexed over one connection.
//
// The protocol is proto/PROTOCOL.md (version 1): SOCK_SEQPACKET with
// SCM_RIGHTS, spoken here with the standard library alone. Every fd this
// package creates or receives is close-on-exec.
//
// # What differs from os/exec
//
//   - The child's parent is the zygote, not this program. The zygote reaps
//     it and sends the exit status, with user and system CPU time and
//     peak RSS (ProcessState.SysUsage); Signal and Kill go through the
//     child's pidfd (Process.Pidfd), so they never hit a reused pid.
//   - The child's fd table holds exactly 0, 1, 2 and ExtraFiles, which is
//     also what os/exec gives: nothing else of this process leaks in.
//   - What the child inherits is copied into each request: the
//     environment (Env, or this process's), the working directory (Dir,
//     or this process's), the umask and the resource limits, so that it
//     looks as if this process had started it. The umask and limits are
//     read at a Client's first spawn; call RefreshProcessState after
//     changing them. The Go runtime raises its own soft RLIMIT_NOFILE at
//     start and os/exec restores the original in children, which a
//     library cannot read: when the limit carries the runtime's mark
//     (soft = hard - 1, recent Go versions), the child gets the zygote's
//     soft limit instead; with older Go versions, the raised one.
//   - A program named without a slash is looked up when the child execs,
//     in the PATH of the child's environment (as execvp(3) does), rather
//     than by Command in this process's PATH. Path keeps the name as
//     given, and a missing program is an error from Start that satisfies
//     errors.Is(err, exec.ErrNotFound) and errors.Is(err, syscall.ENOENT).
//     Every failure to start is a *StartError with the setup step and
//     the errno.
//   - There is no SysProcAttr. Cmd.Zygote holds the zygote's own options:
//     credentials, session and process group, umask, resource limits,
//     kill-on-close (a PR_SET_PDEATHSIG that works although this program
//     is not the parent, and that also fires when this program dies),
//     and a timeout with a grace period. The daemon's policy bounds them:
//     a child never gets more privilege than this program.
//   - If the connection to the daemon is lost, pending calls fail at once
//     with a *ConnectionError, and Wait cannot learn the exit status; it
//     closes the pipes and returns that error.
//
// # A private zygote
//
// LaunchPrivate starts a zygote that serves only this program. Starting
// it is the one fork the program makes: do it early, while the program is
// small.
package zygote
