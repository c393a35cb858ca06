//! Completions (`completions/`) and man pages (`man/`) are generated from the clap
//! definitions and committed. This test fails when they are stale; to refresh them:
//!
//!     DLQCTL_UPDATE_ASSETS=1 cargo test --test assets

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;

fn render() -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for (shell, name) in [(Shell::Bash, "dlqctl.bash"), (Shell::Zsh, "_dlqctl"), (Shell::Fish, "dlqctl.fish")] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut dlqctl::cli::Cli::command(), "dlqctl", &mut buf);
        files.push((root.join("completions").join(name), buf));
    }
    let cmd = dlqctl::cli::Cli::command();
    let mut pages = vec![("dlqctl".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        // clap takes a static name; leaking a few bytes in a test is harmless.
        let name: &'static str = format!("dlqctl-{}", sub.get_name()).leak();
        pages.push((name.to_owned(), sub.clone().name(name)));
    }
    for (name, page) in pages {
        let mut buf = Vec::new();
        clap_mangen::Man::new(page).render(&mut buf).unwrap();
        files.push((root.join("man").join(format!("{name}.1")), buf));
    }
    files
}

#[test]
fn committed_completions_and_man_pages_are_current() {
    let update = std::env::var_os("DLQCTL_UPDATE_ASSETS").is_some();
    let mut stale = Vec::new();
    for (path, content) in render() {
        if std::fs::read(&path).ok().as_deref() == Some(&content[..]) {
            continue;
        }
        if update {
            std::fs::write(&path, &content).unwrap();
        } else {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files: {}\nrefresh them with: DLQCTL_UPDATE_ASSETS=1 cargo test --test assets",
        stale.join(", ")
    );
}
