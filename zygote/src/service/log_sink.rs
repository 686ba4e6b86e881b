//! Where log lines go without ever blocking a daemon thread: a bounded
//! queue, drained by one thread that writes to stderr or the journal.
//!
//! A peer can make the daemon log (a refused request is a WARN line), and
//! the log's reader may stall: a full pipe on stderr, a journald that is
//! behind. Writing in place would then block the thread serving every
//! other peer. Lines that find the queue full are dropped and counted; the
//! writer says how many once it catches up.

use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::{Layer, registry::LookupSpan};

/// Entries the queue holds before it drops.
const CAPACITY: usize = 1024;

/// Bytes the queue holds before it drops.
const CAPACITY_BYTES: usize = 1 << 20;

/// Longest entry kept; longer messages are cut (a journal datagram is
/// limited, and a peer controls some of the text).
const MAX_ENTRY: usize = 16 * 1024;

/// journald's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Where the writer thread puts entries.
#[derive(Debug)]
pub enum Sink {
    /// Lines on stderr.
    Stderr,
    /// Native journal entries on journald's socket.
    Journal(UnixDatagram),
}

impl Sink {
    /// The journal's socket, connected.
    ///
    /// # Errors
    ///
    /// When the socket is missing or refuses the connection.
    pub fn journal() -> io::Result<Self> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(JOURNAL_SOCKET)?;
        Ok(Sink::Journal(socket))
    }

    fn write(&mut self, entry: &[u8]) {
        // Nothing to tell if the sink fails: it is where we would tell it.
        let _ = match self {
            Sink::Stderr => io::stderr().lock().write_all(entry),
            Sink::Journal(socket) => socket.send(entry).map(drop),
        };
    }

    fn dropped_notice(&self, count: u64) -> Vec<u8> {
        let message = format!("{count} log entries dropped: the log was not read fast enough");
        match self {
            Sink::Stderr => format!("zygote: {message}\n").into_bytes(),
            Sink::Journal(_) => {
                let mut entry = journal_header(Level::WARN);
                push_field(&mut entry, "MESSAGE", message.as_bytes());
                entry
            }
        }
    }
}

/// The queue's sending side, shared by every thread that logs.
#[derive(Debug)]
pub struct Queue {
    sender: Mutex<Option<SyncSender<Vec<u8>>>>,
    /// Bytes queued and not yet written.
    queued: AtomicUsize,
    dropped: AtomicU64,
    /// The writer thread, joined by [`Queue::flush`].
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

static QUEUE: OnceLock<Arc<Queue>> = OnceLock::new();

impl Queue {
    /// Starts the writer thread for `sink` and makes this the process's
    /// queue. Call once.
    ///
    /// # Errors
    ///
    /// When the thread cannot start.
    pub fn start(mut sink: Sink) -> io::Result<Arc<Queue>> {
        let (sender, receiver): (_, Receiver<Vec<u8>>) = sync_channel(CAPACITY);
        let queue = Arc::new(Queue {
            sender: Mutex::new(Some(sender)),
            queued: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            writer: Mutex::new(None),
        });
        let shared = Arc::clone(&queue);
        let writer = std::thread::Builder::new()
            .name("zygote-log".into())
            .spawn(move || {
                for entry in receiver {
                    sink.write(&entry);
                    shared.queued.fetch_sub(entry.len(), Ordering::Relaxed);
                    let dropped = shared.dropped.swap(0, Ordering::Relaxed);
                    if dropped > 0 {
                        sink.write(&sink.dropped_notice(dropped));
                    }
                }
            })?;
        *queue.writer.lock().expect("log writer poisoned") = Some(writer);
        let _ = QUEUE.set(Arc::clone(&queue));
        Ok(queue)
    }

    /// Queues one entry, or drops it when the queue is full.
    pub fn push(&self, mut entry: Vec<u8>) {
        entry.truncate(MAX_ENTRY);
        let len = entry.len();
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > CAPACITY_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let sender = self.sender.lock().expect("log queue poisoned").clone();
        let refused = match sender.map(|sender| sender.try_send(entry)) {
            Some(Ok(())) => return,
            Some(Err(TrySendError::Full(_))) => true,
            None | Some(Err(TrySendError::Disconnected(_))) => false,
        };
        self.queued.fetch_sub(len, Ordering::Relaxed);
        if refused {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Entries dropped since the writer last caught up.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Writes what is queued and stops the writer, waiting at most
    /// `limit` for a sink that is not read. Later entries are dropped.
    pub fn flush(&self, limit: Duration) {
        drop(self.sender.lock().expect("log queue poisoned").take());
        let Some(writer) = self.writer.lock().expect("log writer poisoned").take() else {
            return;
        };
        let deadline = Instant::now() + limit;
        while !writer.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if writer.is_finished() {
            let _ = writer.join();
        }
    }
}

/// Waits, at most `limit`, until the writer has written every entry queued
/// so far, and leaves it running: before a live upgrade's exec, which
/// would lose them, and which may fail.
pub fn drain(limit: Duration) {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let deadline = Instant::now() + limit;
    while queue.queued.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Writes what the process's queue holds (at the end of `main`, or before
/// an exec), waiting at most `limit`.
pub fn flush(limit: Duration) {
    if let Some(queue) = QUEUE.get() {
        queue.flush(limit);
    }
}

/// A [`MakeWriter`] for `tracing_subscriber::fmt`: each event is formatted
/// into a buffer that is queued whole when the formatter drops it.
#[derive(Debug, Clone)]
pub struct QueueWriter(pub Arc<Queue>);

/// One event's text on its way to the queue.
#[derive(Debug)]
pub struct Line {
    queue: Arc<Queue>,
    buffer: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.buffer.is_empty() {
            self.queue.push(std::mem::take(&mut self.buffer));
        }
    }
}

impl<'a> MakeWriter<'a> for QueueWriter {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            queue: Arc::clone(&self.0),
            buffer: Vec::with_capacity(256),
        }
    }
}

/// Native journal entries (`systemd.journal-fields(7)`): `MESSAGE`,
/// `PRIORITY` with syslog's numbers (INFO is 6, DEBUG 7),
/// `SYSLOG_IDENTIFIER=zygote`, and each event field as `ZYGOTE_NAME`.
#[derive(Debug)]
pub struct JournalLayer(pub Arc<Queue>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        let mut entry = journal_header(*metadata.level());
        push_field(&mut entry, "TARGET", metadata.target().as_bytes());
        let mut fields = JournalFields {
            entry,
            message: Vec::new(),
        };
        event.record(&mut fields);
        let JournalFields { mut entry, message } = fields;
        push_field(&mut entry, "MESSAGE", &message);
        self.0.push(entry);
    }
}

fn journal_header(level: Level) -> Vec<u8> {
    let priority: &[u8] = match level {
        Level::ERROR => b"3",
        Level::WARN => b"4",
        Level::INFO => b"6",
        Level::DEBUG | Level::TRACE => b"7",
    };
    let mut entry = Vec::with_capacity(256);
    push_field(&mut entry, "PRIORITY", priority);
    push_field(&mut entry, "SYSLOG_IDENTIFIER", b"zygote");
    entry
}

/// Appends `NAME=value\n`, or, for a value with a newline, `NAME\n`, its
/// length as a little-endian u64, the value and `\n`.
fn push_field(entry: &mut Vec<u8>, name: &str, value: &[u8]) {
    entry.extend_from_slice(name.as_bytes());
    if value.contains(&b'\n') {
        entry.push(b'\n');
        entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        entry.push(b'=');
    }
    entry.extend_from_slice(value);
    entry.push(b'\n');
}

/// `ZYGOTE_` and the field's name in journald's alphabet (A–Z, 0–9, _).
fn journal_name(field: &str) -> String {
    let mut name = String::with_capacity(7 + field.len());
    name.push_str("ZYGOTE_");
    name.extend(field.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    name
}

struct JournalFields {
    entry: Vec<u8>,
    message: Vec<u8>,
}

impl Visit for JournalFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.extend_from_slice(value.as_bytes());
        } else {
            push_field(
                &mut self.entry,
                &journal_name(field.name()),
                value.as_bytes(),
            );
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_newlines_are_length_prefixed() {
        let mut entry = Vec::new();
        push_field(&mut entry, "A", b"one");
        push_field(&mut entry, "B", b"two\nlines");
        let mut wanted = b"A=one\nB\n".to_vec();
        wanted.extend_from_slice(&9u64.to_le_bytes());
        wanted.extend_from_slice(b"two\nlines\n");
        assert_eq!(entry, wanted);
    }

    #[test]
    fn field_names_use_journald_alphabet() {
        assert_eq!(journal_name("peer.pid"), "ZYGOTE_PEER_PID");
        assert_eq!(journal_name("errno"), "ZYGOTE_ERRNO");
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        // A sink nobody reads: a datagram pair whose other end is idle.
        let (sink, unread) = UnixDatagram::pair().expect("socketpair");
        let queue = Queue::start(Sink::Journal(sink)).expect("start");
        let started = Instant::now();
        for _ in 0..(CAPACITY * 4) {
            queue.push(vec![b'x'; 1000]);
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "pushing blocked for {:?}",
            started.elapsed()
        );
        // The count restarts whenever the writer catches up (it may not
        // have run at all before the drops): the notice it then writes
        // says they were counted.
        unread
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        let mut datagram = vec![0u8; 64 * 1024];
        let noticed = loop {
            let Ok(len) = unread.recv(&mut datagram) else {
                break false;
            };
            let text = String::from_utf8_lossy(&datagram[..len]);
            if text.contains("log entries dropped") {
                break true;
            }
        };
        assert!(noticed, "no drop was counted");
        queue.flush(Duration::from_millis(50));
    }
}
