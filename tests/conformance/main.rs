//! The conformance suite: the same scenarios, written once against the `Broker` trait,
//! run against every backend (as `object_store` does with its shared integration tests).
//! A backend module only says how to make a DLQ holding given dead letters, then calls
//! `conformance_suite!` with that fixture.

#[path = "../support/mod.rs"]
mod support;

mod brokers;
mod scenarios;

/// Instantiate every scenario as a test against `$fixture` (an expression building a
/// fresh [`scenarios::Fixture`] for each test).
macro_rules! conformance_suite {
    ($fixture:expr) => {
        conformance_suite!(@tests $fixture;
            describe_reports_depth,
            peek_returns_n_and_leaves_depth,
            peek_each_shows_what_peek_reads,
            reasons_match_what_was_seeded,
            export_round_trip_is_lossless,
            settle_removes_exactly_the_settled,
            release_leaves_them,
            a_consuming_run_ends_with_exactly_the_unsettled,
            unsupported_is_not_supported,
        );
    };
    (@tests $fixture:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $scenario() {
                crate::scenarios::$scenario(&$fixture).await;
            }
        )*
    };
}

mod archive;

mod rabbitmq {
    use crate::brokers::BrokerFixture;
    use crate::support::TestBroker;

    conformance_suite!(BrokerFixture::new(TestBroker::Rabbitmq));
}

mod sqs {
    use crate::brokers::BrokerFixture;
    use crate::support::TestBroker;

    conformance_suite!(BrokerFixture::new(TestBroker::Sqs));
}

mod kafka {
    use crate::brokers::BrokerFixture;
    use crate::support::TestBroker;

    conformance_suite!(BrokerFixture::new(TestBroker::Kafka));
}
