use std::process::ExitCode;

use clap::Parser as _;

// lapin and librdkafka hand each message from their I/O thread to ours: glibc's allocator
// then serializes frees across threads on an arena lock, and mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dlqctl::commands::run(dlqctl::cli::Cli::parse())
}
