//! The fixture the real brokers' instantiations of the suite use: each DLQ is a fresh
//! namespace on a broker started by `scripts/brokers up`, filled with real dead letters.
//! A backend joins the suite with one `conformance_suite!` line in `main.rs`.

use std::sync::Mutex;

use async_trait::async_trait;
use dlqctl::broker::{self, Broker, OpenOptions};
use dlqctl::model::{DeadLetter, ReasonKind};
use dlqctl::target::Target;

use crate::scenarios::Fixture;
use crate::support::{Namespace, TestBroker, require};

pub struct BrokerFixture {
    broker: TestBroker,
    /// Kept until the test ends, then each namespace removes itself.
    namespaces: Mutex<Vec<Namespace>>,
}

impl BrokerFixture {
    pub fn new(broker: TestBroker) -> Self {
        if broker == TestBroker::Sqs {
            crate::support::localstack_env();
        }
        BrokerFixture { broker, namespaces: Mutex::new(Vec::new()) }
    }
}

#[async_trait]
impl Fixture for BrokerFixture {
    async fn dlq_with(&self, letters: &[DeadLetter]) -> Box<dyn Broker> {
        require(self.broker).expect("broker tests run only with the brokers up");
        let namespace = Namespace::create(self.broker, letters);
        let target = Target::parse(&namespace.target).unwrap();
        self.namespaces.lock().unwrap().push(namespace);
        broker::open(&target, &OpenOptions::default()).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// What `scripts/brokers fixture` makes each broker report.
    fn reason_for(&self, _seeded: &DeadLetter) -> ReasonKind {
        match self.broker {
            TestBroker::Rabbitmq => ReasonKind::Rejected,
            TestBroker::Sqs => ReasonKind::MaxReceiveCount,
            TestBroker::Kafka => ReasonKind::Exception,
        }
    }
}
