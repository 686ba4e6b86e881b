//! Frames with fds over a real SEQPACKET socket pair: the fds arrive whole
//! and close-on-exec, and every limit is enforced on both sides without
//! leaking an fd.
//!
//! Tests here count the process's open fds, so they hold [`LOCK`] to keep
//! the other tests in this binary from opening fds meanwhile.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use rustix::fs::{Mode, OFlags};
use rustix::io::FdFlags;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg, sockopt};

use zygote_proto::socket::pair;
use zygote_proto::{
    MAX_FDS_PER_FRAME, MAX_FRAME_BYTES, ProtoError, RECV_BUFFER_BYTES, recv_frame, send_frame,
};

static LOCK: Mutex<()> = Mutex::new(());

fn serialize() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `/dev/null`, opened *without* close-on-exec, so that a close-on-exec fd
/// on the receiving side proves `MSG_CMSG_CLOEXEC` and not the sender.
fn dev_null() -> OwnedFd {
    rustix::fs::open("/dev/null", OFlags::RDONLY, Mode::empty()).expect("open /dev/null")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

fn scratch() -> Vec<u8> {
    vec![0; RECV_BUFFER_BYTES]
}

/// Sends a frame with `sendmsg` directly, bypassing `send_frame`'s limits.
fn send_raw(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let sent = sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .expect("raw sendmsg");
    assert_eq!(sent, bytes.len());
}

fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let a = rustix::fs::fstat(a).expect("fstat");
    let b = rustix::fs::fstat(b).expect("fstat");
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
}

#[test]
fn three_fds_arrive_with_the_bytes_and_close_on_exec() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    let (pipe_read, pipe_write) = rustix::pipe::pipe().expect("pipe");
    let null = dev_null();
    let sent = [pipe_read.as_fd(), pipe_write.as_fd(), null.as_fd()];
    for fd in sent {
        let flags = rustix::io::fcntl_getfd(fd).expect("F_GETFD");
        assert!(
            !flags.contains(FdFlags::CLOEXEC),
            "test fds start inheritable"
        );
    }

    send_frame(a.as_fd(), b"three fds", &sent).expect("send");
    let frame = recv_frame(b.as_fd(), &mut scratch())
        .expect("recv")
        .expect("a frame, not end of stream");

    assert_eq!(frame.bytes, b"three fds");
    assert_eq!(frame.fds.len(), 3);
    for (received, original) in frame.fds.iter().zip(sent) {
        let flags = rustix::io::fcntl_getfd(received).expect("F_GETFD");
        assert!(
            flags.contains(FdFlags::CLOEXEC),
            "received fd is inheritable"
        );
        assert!(same_file(received.as_fd(), original), "fds arrive in order");
    }
}

#[test]
fn a_frame_of_exactly_the_limit_arrives_whole() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    let bytes: Vec<u8> = (0..MAX_FRAME_BYTES).map(|i| (i % 251) as u8).collect();
    send_frame(a.as_fd(), &bytes, &[]).expect("send");
    let frame = recv_frame(b.as_fd(), &mut scratch())
        .expect("recv")
        .expect("a frame");
    assert_eq!(frame.bytes, bytes);
    assert!(frame.fds.is_empty());
}

#[test]
fn send_frame_refuses_frames_over_the_limits() {
    let _guard = serialize();
    let (a, _b) = pair(false).expect("socketpair");

    let too_big = vec![0; MAX_FRAME_BYTES + 1];
    match send_frame(a.as_fd(), &too_big, &[]) {
        Err(ProtoError::FrameTooLarge { size, limit }) => {
            assert_eq!(size, MAX_FRAME_BYTES + 1);
            assert_eq!(limit, MAX_FRAME_BYTES);
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }

    let null = dev_null();
    let fds = vec![null.as_fd(); MAX_FDS_PER_FRAME + 1];
    match send_frame(a.as_fd(), b"x", &fds) {
        Err(ProtoError::TooManyFds { limit }) => assert_eq!(limit, MAX_FDS_PER_FRAME),
        other => panic!("expected TooManyFds, got {other:?}"),
    }
}

#[test]
fn too_many_fds_from_a_raw_sender_are_refused_and_closed() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    let before = open_fds();

    let null = dev_null();
    let fds: Vec<OwnedFd> = (0..70)
        .map(|_| rustix::io::dup(&null).expect("dup"))
        .collect();
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    send_raw(a.as_fd(), b"seventy", &borrowed);
    drop(borrowed);
    drop(fds);
    drop(null);

    match recv_frame(b.as_fd(), &mut scratch()) {
        Err(ProtoError::TooManyFds { limit }) => assert_eq!(limit, MAX_FDS_PER_FRAME),
        other => panic!("expected TooManyFds, got {other:?}"),
    }
    assert_eq!(open_fds(), before, "received fds were not all closed");

    // The bad frame is consumed; the next one arrives normally.
    send_frame(a.as_fd(), b"next", &[]).expect("send");
    let frame = recv_frame(b.as_fd(), &mut scratch())
        .expect("recv")
        .expect("a frame");
    assert_eq!(frame.bytes, b"next");
}

/// Exactly the announced limit: 64 fds pass, 65 and 67 are refused (the
/// control buffer is rounded up, so the kernel alone would let 65 and 66
/// through), and every refused fd is closed.
#[test]
fn the_fd_limit_is_exactly_the_announced_one() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    let before = open_fds();
    for count in [
        MAX_FDS_PER_FRAME,
        MAX_FDS_PER_FRAME + 1,
        MAX_FDS_PER_FRAME + 3,
    ] {
        let null = dev_null();
        let fds: Vec<OwnedFd> = (0..count)
            .map(|_| rustix::io::dup(&null).expect("dup"))
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        send_raw(a.as_fd(), b"fds", &borrowed);
        drop(borrowed);
        drop(fds);
        drop(null);
        match recv_frame(b.as_fd(), &mut scratch()) {
            Ok(Some(frame)) if count <= MAX_FDS_PER_FRAME => assert_eq!(frame.fds.len(), count),
            Err(ProtoError::TooManyFds { limit }) if count > MAX_FDS_PER_FRAME => {
                assert_eq!(limit, MAX_FDS_PER_FRAME);
            }
            other => panic!("{count} fds: unexpected {other:?}"),
        }
        assert_eq!(open_fds(), before, "{count} fds: received fds stayed open");
    }
}

#[test]
fn an_oversized_raw_frame_is_frame_too_large() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    // A Unix datagram must fit the sender's buffer; the kernel caps this at
    // net.core.wmem_max and then doubles it, which leaves room for 300 KiB
    // even at the common default of 208 KiB.
    sockopt::set_socket_send_buffer_size(&a, 1 << 20).expect("SO_SNDBUF");
    let before = open_fds();

    let size = 300 * 1024;
    let null = dev_null();
    send_raw(a.as_fd(), &vec![0x5a; size], &[null.as_fd()]);
    drop(null);

    match recv_frame(b.as_fd(), &mut scratch()) {
        Err(ProtoError::FrameTooLarge { size: seen, limit }) => {
            assert_eq!(seen, size, "MSG_TRUNC reports the real size");
            assert_eq!(limit, MAX_FRAME_BYTES);
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    assert_eq!(
        open_fds(),
        before,
        "the oversized frame's fd was not closed"
    );

    send_frame(a.as_fd(), b"next", &[]).expect("send");
    let frame = recv_frame(b.as_fd(), &mut scratch())
        .expect("recv")
        .expect("a frame");
    assert_eq!(frame.bytes, b"next");
}

#[test]
fn a_closed_peer_reads_as_none_after_its_queued_frames() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    let null = dev_null();
    send_frame(a.as_fd(), b"last words", &[null.as_fd()]).expect("send");
    drop(a);

    let frame = recv_frame(b.as_fd(), &mut scratch())
        .expect("recv")
        .expect("the queued frame");
    assert_eq!(frame.bytes, b"last words");
    assert_eq!(frame.fds.len(), 1);
    assert!(
        recv_frame(b.as_fd(), &mut scratch())
            .expect("recv")
            .is_none()
    );
    assert!(
        recv_frame(b.as_fd(), &mut scratch())
            .expect("recv")
            .is_none()
    );
}

#[test]
fn sending_to_a_closed_peer_is_a_disconnect_not_sigpipe() {
    let _guard = serialize();
    let (a, b) = pair(false).expect("socketpair");
    drop(b);
    match send_frame(a.as_fd(), b"anyone?", &[]) {
        Err(error) => assert!(error.is_disconnect(), "{error:?}"),
        Ok(()) => panic!("sent to a closed peer"),
    }
}
