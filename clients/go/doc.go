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
// where client comes from Dial, DialDefault or LaunchPrivate, or keep
// the package-level form, zygote.Command("git", "log"), which (as a Cmd
// literal such as &zygote.Cmd{Path: "/bin/true"} does) uses
// DefaultClient, dialled on first use. Cmd has
// os/exec's fields and methods (Run, Start, Wait, Output, CombinedOutput,
// the pipes, Cancel and WaitDelay), Cmd.Process can be signalled and
// carries the child's pidfd, and Cmd.ProcessState has the exit status and
// the resource usage. One Client may be used by any number of goroutines:
// their spawns are multiplexed over one connection.
//
// The protocol is proto/PROTOCOL.md (versions 1 to 4, negotiated at
// connect): SOCK_SEQPACKET with SCM_RIGHTS, spoken here with the standard
// library alone. Every fd this
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
//     or this process's), the umask, the resource limits, the ignored
//     signals, the nice value, the CPU affinity and the OOM score
//     adjustment, so that it looks as if this process had started it (the
//     Rust client copies the same). All but the environment and directory
//     are read at a Client's first spawn; call RefreshProcessState after
//     changing them. The nice value and the affinity are per thread on
//     Linux: they are read on the thread that makes that call. The Go runtime raises its own soft RLIMIT_NOFILE at
//     start and os/exec restores the original in children, which a
//     library cannot read: when the limit carries the runtime's mark
//     (soft = hard - 1, recent Go versions), the child gets the zygote's
//     soft limit instead; with older Go versions, the raised one.
//   - An environment entry without "=" (Env's or this process's) names no
//     variable and is left out; os/exec passes it on raw, which the
//     protocol cannot carry. Other odd entries, such as the "=A=B" that
//     some shells and Windows-ported tools leave, reach the child byte for
//     byte, as with os/exec.
//   - As in os/exec, Command looks a name without a slash up in this
//     process's PATH and sets Path to what it found, or Cmd.Err (which
//     satisfies errors.Is(err, exec.ErrNotFound) and errors.Is(err,
//     syscall.ENOENT)) when nothing was. A Path without a slash set by
//     hand is looked up by the zygote in the PATH of the child's
//     environment when it execs. Every failure to start is a *StartError
//     with the setup step and the errno.
//   - There is no SysProcAttr. Cmd.Zygote holds the zygote's own options:
//     credentials, session and process group, umask, resource limits,
//     kill-on-close (a PR_SET_PDEATHSIG that works although this program
//     is not the parent, and that also fires when this program dies),
//     a timeout with a grace period, and the child's own cgroup
//     (CgroupOptions: memory, pids and CPU limits, a kill and a Wait that
//     cover the whole process tree, and its tree-wide usage in
//     ProcessState.TreeUsage), and a Sandbox (namespaces, mounts,
//     seccomp, Landlock; what was applied is in Process.Sandbox). The
//     daemon's policy bounds them: a child never gets more privilege than
//     this program.
//   - Process has Wait and Release as os.Process does; Wait returns the
//     status without treating a non-zero exit as an error.
//   - Where the condition is os/exec's (a second Start, no command, a
//     pipe asked for twice or too late, Wait twice or before Start,
//     Cancel without a context), the error text is os/exec's, "exec:
//     already started" and so on. A nil Cancel means what it means in
//     os/exec: the context does not interrupt the child, and only
//     WaitDelay (then a kill) ends the wait.
//   - Options that the child's setup call would refuse (a resource that
//     is not an RLIMIT_* number, Cur over Max, a Pgid or KillOnClose out
//     of range, a negative TimeoutGrace) fail Start with an error that
//     satisfies errors.Is(err, syscall.EINVAL), before anything is sent.
//   - If the connection to the daemon is lost, pending calls fail at once
//     with a *ConnectionError, and the next call of a Client made by Dial
//     reconnects (10 attempts with backoff, about 4.6 s in all, as the
//     Rust and Python clients do). Wait
//     on a child of the lost daemon reads the exit status from the
//     child's pidfd on Linux 6.15 and later (without resource usage:
//     ProcessState.UsageAvailable is false), once its new parent has
//     reaped it; on older kernels it returns the *ConnectionError and
//     closes the pipes. Signal and Kill keep working through the pidfd.
//   - Run, Output and CombinedOutput ask the daemon to send the pid and
//     pidfd only for a child still running 10 to 20 ms after exec; a shorter
//     one is known by its exit alone. Inside them Process.Pid is 0 until
//     the child is known (Cancel should signal, not read the pid), and a
//     daemon lost before then leaves no pidfd: Run returns a
//     *ConnectionError saying the status is lost. Start never defers.
//
// # Warm templates
//
// Client.PythonTemplate asks the zygote for a Python interpreter that has
// imported a preload list; Template.Command gives a Cmd whose child is a
// fork of it, which runs its Python arguments as `python ARGS` would,
// without the interpreter's start and the imports. See Template.
//
// # A private zygote
//
// LaunchPrivate starts a zygote that serves only this program. Starting
// it is the one fork the program makes: do it early, while the program is
// small.
package zygote
