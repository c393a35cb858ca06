use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    dlqctl::commands::run(dlqctl::cli::Cli::parse())
}
