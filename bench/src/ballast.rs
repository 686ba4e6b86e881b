//! Making the parent large: touched memory and open fds.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::io::fcntl_dupfd_cloexec;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::error::{Error, Result};

const GIB: usize = 1 << 30;
const PAGE: usize = 4096;

/// Touched memory, grown a GiB at a time.
#[derive(Debug, Default)]
pub struct Memory {
    chunks: Vec<Vec<u8>>,
    round: u8,
}

impl Memory {
    /// Grows to `gib` GiB, every page written.
    pub fn grow_to(&mut self, gib: usize) {
        while self.chunks.len() < gib {
            self.chunks.push(vec![1u8; GIB]);
        }
    }

    /// GiB held.
    pub fn gib(&self) -> usize {
        self.chunks.len()
    }

    /// Writes one byte in every page and returns how long it took: the
    /// cost of the parent going on with its work. After a fork, every page
    /// is write-protected and each first write faults (copy-on-write).
    pub fn rewrite(&mut self) -> Duration {
        self.round = self.round.wrapping_add(1);
        let round = self.round;
        let start = Instant::now();
        for chunk in &mut self.chunks {
            for page in chunk.chunks_mut(PAGE) {
                page[0] = round;
            }
        }
        let took = start.elapsed();
        std::hint::black_box(&self.chunks);
        took
    }
}

/// Open fds (close-on-exec duplicates of /dev/null), as a busy server has.
#[derive(Debug)]
pub struct Fds {
    null: File,
    open: Vec<OwnedFd>,
}

impl Fds {
    /// Raises the soft fd limit to the hard one.
    ///
    /// # Errors
    ///
    /// When /dev/null cannot be opened or the limit set.
    pub fn new() -> Result<Self> {
        let limit = getrlimit(Resource::Nofile);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )
        .map_err(|errno| Error::io("raising RLIMIT_NOFILE")(errno.into()))?;
        let null = File::open("/dev/null").map_err(Error::io("opening /dev/null"))?;
        Ok(Self {
            null,
            open: Vec::new(),
        })
    }

    /// The most fds we may add: the hard limit, minus what is open now,
    /// minus `headroom` for pipes, pidfds and sockets during the run.
    pub fn max_extra(&self, headroom: usize) -> usize {
        let hard = getrlimit(Resource::Nofile).maximum.unwrap_or(1 << 20);
        let open_now = std::fs::read_dir("/proc/self/fd").map_or(64, Iterator::count);
        usize::try_from(hard)
            .unwrap_or(usize::MAX)
            .saturating_sub(open_now + headroom)
    }

    /// Holds exactly `count` extra fds.
    ///
    /// # Errors
    ///
    /// When an fd cannot be duplicated.
    pub fn set(&mut self, count: usize) -> Result<()> {
        self.open.truncate(count);
        while self.open.len() < count {
            let fd = fcntl_dupfd_cloexec(&self.null, 3)
                .map_err(|errno| Error::io("opening fds")(errno.into()))?;
            self.open.push(fd);
        }
        Ok(())
    }
}
