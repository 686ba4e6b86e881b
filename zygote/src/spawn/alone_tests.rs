//! Tests that take or change what belongs to the whole process (its
//! children, its address space), so each runs in a process of its own:
//! the test binary run again for that one test.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{OrphanReaping, adopt_own, clone, expect_sibling, reap_orphans, reap_orphans_by_scan};

/// Set in the process that runs one test alone: the test's path.
const ALONE: &str = "ZYGOTE_TEST_ALONE";

/// Runs `body` in a process of its own: this test binary run again for
/// the test `path` only, which must pass within a minute.
pub(super) fn in_a_process_of_its_own(path: &str, body: impl FnOnce()) {
    if std::env::var_os(ALONE).is_some_and(|running| running == path) {
        body();
        return;
    }
    let mut run = Command::new(std::env::current_exe().unwrap())
        .args([path, "--exact", "--test-threads", "1", "--nocapture"])
        .env(ALONE, path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            let _ = run.wait();
            panic!("{path} did not finish alone within a minute");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut output = String::new();
    std::io::Read::read_to_string(&mut run.stdout.take().unwrap(), &mut output).unwrap();
    assert!(
        status.success(),
        "{path} failed alone ({status:?}):\n{output}"
    );
    // A misspelt path runs nothing, and passes.
    assert!(
        output.contains("1 passed"),
        "{path} did not run alone:\n{output}"
    );
}

/// Starts `/bin/true` and waits until it is a zombie: an exited child of
/// this process, unreaped, that `spawn` did not list as its own.
#[allow(clippy::zombie_processes, reason = "the zombie is what the tests reap")]
fn exited_child() -> i32 {
    let child = Command::new("/bin/true").spawn().unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_zombie(pid) {
        assert!(Instant::now() < deadline, "{pid} never exited");
        std::thread::sleep(Duration::from_millis(1));
    }
    pid
}

fn is_zombie(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name.trim_start().starts_with('Z')
}

/// Whether `pid` is still a child to reap: a reaped one is gone (`ECHILD`).
fn still_unreaped(pid: i32) -> bool {
    // SAFETY: an all-zero siginfo_t is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let id = libc::id_t::try_from(pid).unwrap();
    let options = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: writes into `info`, which outlives the call; WNOWAIT
    // leaves the child as it is.
    (unsafe { libc::waitid(libc::P_PID, id, &raw mut info, options) }) == 0
}

fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: plain syscall writing into `status`.
    assert_eq!(unsafe { libc::waitpid(pid, &raw mut status, 0) }, pid);
}

#[test]
fn orphans_in_line_are_all_reaped_and_counted() {
    in_a_process_of_its_own(
        "spawn::alone_tests::orphans_in_line_are_all_reaped_and_counted",
        || {
            let orphans = [exited_child(), exited_child(), exited_child()];
            assert_eq!(
                reap_orphans(),
                OrphanReaping {
                    reaped: 3,
                    blocked_by_own: false
                }
            );
            for pid in orphans {
                assert!(!still_unreaped(pid), "orphan {pid} was left");
            }
            assert_eq!(reap_orphans().reaped, 0);
        },
    );
}

#[test]
fn the_scan_reaps_the_orphans_behind_an_own_child_and_leaves_it() {
    in_a_process_of_its_own(
        "spawn::alone_tests::the_scan_reaps_the_orphans_behind_an_own_child_and_leaves_it",
        || {
            let own = exited_child();
            adopt_own(own);
            let orphans = [exited_child(), exited_child()];
            // The kernel offers the oldest exited child first: our own.
            assert_eq!(
                reap_orphans(),
                OrphanReaping {
                    reaped: 0,
                    blocked_by_own: true
                }
            );
            assert_eq!(
                reap_orphans_by_scan(),
                OrphanReaping {
                    reaped: 2,
                    blocked_by_own: false
                },
                "our own child is its pidfd owner's to reap"
            );
            for pid in orphans {
                assert!(!still_unreaped(pid), "orphan {pid} was left");
            }
            assert!(still_unreaped(own), "the scan reaped a child of ours");
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            assert_eq!(clone::exited_uid(own), Some(uid));
            reap(own);
        },
    );
}

#[test]
fn the_scan_leaves_exited_children_of_an_expected_spawners_uid() {
    in_a_process_of_its_own(
        "spawn::alone_tests::the_scan_leaves_exited_children_of_an_expected_spawners_uid",
        || {
            // SAFETY: getuid cannot fail.
            let expected = expect_sibling(unsafe { libc::getuid() });
            let child = exited_child();
            assert!(reap_orphans().blocked_by_own);
            assert_eq!(
                reap_orphans_by_scan(),
                OrphanReaping {
                    reaped: 0,
                    blocked_by_own: true
                },
                "left, and to be looked at again"
            );
            assert!(still_unreaped(child));
            drop(expected);
            assert_eq!(
                reap_orphans_by_scan(),
                OrphanReaping {
                    reaped: 1,
                    blocked_by_own: false
                }
            );
            assert!(!still_unreaped(child));
        },
    );
}

#[test]
fn a_stack_is_unmapped_when_dropped() {
    in_a_process_of_its_own(
        "spawn::alone_tests::a_stack_is_unmapped_when_dropped",
        || {
            let (base, len) = clone::stack_mapping_after_drop();
            // SAFETY: msync only asks whether the range is mapped.
            let ret = unsafe { libc::msync(base, len, libc::MS_ASYNC) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            assert_eq!(
                (ret, errno),
                (-1, Some(libc::ENOMEM)),
                "the stack is still mapped"
            );
        },
    );
}

#[test]
fn a_socket_inherited_as_stderr_moves_to_fd_3_and_every_other_fd_is_closed() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    in_a_process_of_its_own(
        "spawn::alone_tests::a_socket_inherited_as_stderr_moves_to_fd_3_and_every_other_fd_is_closed",
        || {
            // As a private zygote starts: its socket at a stdio number (2
            // here: the parent reads only this process's stdout), fd 3
            // free, and some other fd above it, which must go.
            // SAFETY: nothing of this process uses an fd above 2 now.
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
            let (socket, other) = std::os::unix::net::UnixStream::pair().unwrap();
            let (socket, other) = (socket.into_raw_fd(), other.into_raw_fd());
            assert_eq!((socket, other), (3, 4));
            // SAFETY: moves our own socket onto fd 2, then closes fd 3.
            unsafe {
                assert_eq!(libc::dup2(socket, 2), 2);
                libc::close(socket);
            }
            let taken = super::take_inherited_fd(2);
            // SAFETY: only asks for the flags of a number.
            let other_open = unsafe { libc::fcntl(other, libc::F_GETFD) } >= 0;
            let stderr = std::fs::read_link("/proc/self/fd/2").unwrap();
            println!("taken {taken:?}, stderr {stderr:?}, fd {other} open: {other_open}");
            assert_eq!(taken.unwrap().as_raw_fd(), 3);
            assert_eq!(stderr, std::path::Path::new("/dev/null"));
            assert!(!other_open, "fd {other} was left open");
        },
    );
}

/// A spawn in its vfork holds the gate for reading until its child has
/// exec'd, which the child's owner can delay: the orphan reaper does not
/// wait to write meanwhile (every later spawn would wait behind it), but
/// leaves the orphans for a later look.
#[test]
fn the_orphan_reaper_never_waits_for_a_spawn_in_its_vfork() {
    in_a_process_of_its_own(
        "spawn::alone_tests::the_orphan_reaper_never_waits_for_a_spawn_in_its_vfork",
        || {
            let orphan = exited_child();
            let (held, release) = std::sync::mpsc::channel::<()>();
            let (holding, gate_held) = std::sync::mpsc::channel::<()>();
            let spawn_in_vfork = std::thread::spawn(move || {
                let _gate = super::OWN
                    .gate
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                holding.send(()).expect("say the gate is held");
                let _ = release.recv();
            });
            gate_held.recv().expect("the gate held");
            let (done, looked) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = done.send((reap_orphans(), reap_orphans_by_scan()));
            });
            let looked = looked.recv_timeout(Duration::from_secs(5));
            drop(held);
            spawn_in_vfork.join().expect("the holder");
            let blocked = OrphanReaping {
                reaped: 0,
                blocked_by_own: true,
            };
            assert_eq!(
                looked.expect("the orphan reaper waited for the gate"),
                (blocked, blocked)
            );
            assert!(still_unreaped(orphan), "reaped without the gate");
            assert_eq!(reap_orphans_by_scan().reaped, 1, "reaped once it is free");
        },
    );
}
