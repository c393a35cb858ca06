//! The archive backend's instantiation of the conformance suite.

use async_trait::async_trait;
use dlqctl::broker::archive::ArchiveBroker;
use dlqctl::broker::{Broker, OpenOptions};
use dlqctl::model::DeadLetter;
use dlqctl::target::ArchiveTarget;

use crate::scenarios::{self, Fixture};

/// Each DLQ is a file in its own temporary directory, removed with the fixture.
struct Archive {
    dir: tempfile::TempDir,
}

impl Archive {
    fn new() -> Self {
        Archive { dir: tempfile::tempdir().unwrap() }
    }
}

#[async_trait]
impl Fixture for Archive {
    async fn dlq_with(&self, letters: &[DeadLetter]) -> Box<dyn Broker> {
        let path = tempfile::Builder::new().suffix(".jsonl").tempfile_in(self.dir.path()).unwrap().into_temp_path();
        std::fs::write(&path, crate::support::jsonl(letters)).unwrap();
        let path = path.keep().unwrap();
        Box::new(ArchiveBroker::open(ArchiveTarget::File(path), &OpenOptions::default()).await.unwrap())
    }
}

conformance_suite!(Archive::new());

#[tokio::test]
async fn stdin_can_be_read_but_not_consumed() {
    let stdin = ArchiveBroker::open(ArchiveTarget::Stdin, &OpenOptions::default()).await.unwrap();
    assert!(!stdin.capabilities().consume);
    scenarios::assert_not_supported_where_not_capable(&stdin).await;
}
