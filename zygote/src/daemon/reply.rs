//! Sending a reply to a client, shared by the connection loop and the
//! spawn tasks.

use std::borrow::Cow;
use std::os::fd::BorrowedFd;

use tracing::warn;
use zygote_proto::{AsyncSeqpacket, InVersion, ServerMessage};

/// Longest error text a reply carries, in bytes. Refusals may quote what
/// the client sent (an env name, a path); a client must not be able to
/// make the daemon hold many copies of 100 KiB of its own text.
pub(crate) const MAX_REPLY_TEXT: usize = 1024;

/// Sends a reply in the layout of the connection's protocol `version`; a
/// client that already left is not an error.
pub(crate) async fn send_reply(
    socket: &AsyncSeqpacket,
    message: &ServerMessage,
    version: u32,
    fds: &[BorrowedFd<'_>],
) {
    let message = clipped(message);
    let message = InVersion::new(&*message, version);
    if let Err(error) = socket.send_message(&message, fds).await {
        if !error.is_disconnect() {
            warn!(%error, "failed to send a reply");
        }
    }
}

/// As [`send_reply`]; `Err` when it could not be sent (the client left,
/// or another error, logged).
pub(crate) async fn send_reply_checked(
    socket: &AsyncSeqpacket,
    message: &ServerMessage,
    version: u32,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ()> {
    let message = clipped(message);
    let message = InVersion::new(&*message, version);
    socket.send_message(&message, fds).await.map_err(|error| {
        if !error.is_disconnect() {
            warn!(%error, "failed to send a reply");
        }
    })
}

/// `message` with its error text cut to [`MAX_REPLY_TEXT`].
pub(crate) fn clipped(message: &ServerMessage) -> Cow<'_, ServerMessage> {
    let text = match message {
        ServerMessage::SpawnFailed(failed) => &failed.message,
        ServerMessage::RequestFailed(failed) => &failed.message,
        ServerMessage::ProtocolError(error) => &error.message,
        _ => return Cow::Borrowed(message),
    };
    if text.len() <= MAX_REPLY_TEXT {
        return Cow::Borrowed(message);
    }
    let mut message = message.clone();
    let text = match &mut message {
        ServerMessage::SpawnFailed(failed) => &mut failed.message,
        ServerMessage::RequestFailed(failed) => &mut failed.message,
        ServerMessage::ProtocolError(error) => &mut error.message,
        _ => return Cow::Owned(message),
    };
    clip(text);
    Cow::Owned(message)
}

/// Cuts `text` to at most [`MAX_REPLY_TEXT`] bytes, on a character
/// boundary, marking the cut.
pub(crate) fn clip(text: &mut String) {
    const MARK: &str = " [...]";
    if text.len() <= MAX_REPLY_TEXT {
        return;
    }
    let mut end = MAX_REPLY_TEXT - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(MARK);
    // Give the rest back: a queued refusal must not keep 100 KiB alive.
    text.shrink_to_fit();
}

/// Cuts `text` to at most [`MAX_REPLY_TEXT`] bytes by dropping its
/// middle, marking the cut: for a traceback, whose first line says what
/// failed and whose last says why.
pub(crate) fn clip_middle(text: &mut String) {
    const MARK: &str = "\n[...]\n";
    const HEAD: usize = 256;
    if text.len() <= MAX_REPLY_TEXT {
        return;
    }
    let mut head = HEAD;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (MAX_REPLY_TEXT - HEAD - MARK.len());
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    *text = format!("{}{MARK}{}", &text[..head], &text[tail..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_clipped_on_a_character_boundary() {
        let mut text = "é".repeat(MAX_REPLY_TEXT);
        clip(&mut text);
        assert!(text.len() <= MAX_REPLY_TEXT, "{}", text.len());
        assert!(text.ends_with(" [...]"));
        let mut short = "short".to_owned();
        clip(&mut short);
        assert_eq!(short, "short");
    }

    #[test]
    fn a_long_traceback_keeps_its_first_and_last_lines() {
        let mut text = format!(
            "preload x raised:\n{}ValueError: why",
            "é  frame\n".repeat(500)
        );
        clip_middle(&mut text);
        assert!(text.len() <= MAX_REPLY_TEXT, "{}", text.len());
        assert!(text.starts_with("preload x raised:\n"), "{text}");
        assert!(text.ends_with("ValueError: why"), "{text}");
        assert!(text.contains("\n[...]\n"), "{text}");
    }
}
