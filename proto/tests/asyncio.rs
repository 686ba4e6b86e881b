//! `AsyncSeqpacket` on a real socket pair: a send that finds the peer's
//! queue full waits, without losing or reordering frames, and completes
//! once the peer reads.

use std::time::Duration;

use zygote_proto::socket::pair;
use zygote_proto::{AsyncSeqpacket, RECV_BUFFER_BYTES};

fn frame(index: u8) -> Vec<u8> {
    vec![index; 32 * 1024]
}

#[tokio::test]
async fn a_send_to_a_full_queue_waits_then_completes_in_order() {
    let (left, right) = pair(true).expect("socketpair");
    let sender = AsyncSeqpacket::new(left).expect("register sender");
    let receiver = AsyncSeqpacket::new(right).expect("register receiver");

    // Fill the peer's queue until a send no longer completes at once.
    let mut sent = 0u8;
    loop {
        let bytes = frame(sent);
        let send = sender.send(&bytes, &[]);
        match tokio::time::timeout(Duration::from_millis(50), send).await {
            Ok(result) => {
                result.expect("send to a queue with room");
                sent += 1;
                assert!(sent < 200, "the queue never filled");
            }
            Err(_) => break,
        }
    }
    assert!(sent > 0, "not even one frame fitted");

    // The blocked frame goes out once the receiver drains the queue.
    let blocked = frame(sent);
    let (sent_result, received) = tokio::join!(sender.send(&blocked, &[]), async {
        let mut scratch = vec![0u8; RECV_BUFFER_BYTES];
        let mut firsts = Vec::new();
        for _ in 0..=sent {
            let got = receiver
                .recv(&mut scratch)
                .await
                .expect("recv")
                .expect("frame, not end of stream");
            assert_eq!(got.bytes.len(), 32 * 1024);
            firsts.push(got.bytes[0]);
        }
        firsts
    });
    sent_result.expect("the blocked send completes");
    // The timed-out attempt above was dropped before it sent anything, so
    // the frames are 0..sent, then the retried one.
    let expected: Vec<u8> = (0..=sent).collect();
    assert_eq!(received, expected);
}
