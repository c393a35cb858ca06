use std::process::ExitCode;

use clap::Parser as _;

// lapin and librdkafka hand each message from their I/O thread to ours: glibc's allocator
// then serializes frees across threads on an arena lock, and mimalloc does not. With the
// crate's `override`, the C libraries' malloc is mimalloc's as well (glibc lets a program
// replace malloc for everything in it): librdkafka allocates each record and each header it
// parses, and this took 7% of a Kafka export's instructions and 10% of a summarize's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dlqctl::commands::run(dlqctl::cli::Cli::parse())
}
