//! The daemon's handling of a spawn request, short of creating a process:
//! policy check, validation and planning. The first byte picks how many
//! fds come with the frame.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&fds, frame)) = data.split_first() {
        zygote::fuzzing::handle_frame(frame, fds);
    }
});
