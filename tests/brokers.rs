//! The test brokers themselves: reachable, seeded, and never silently skipped.

mod support;

use support::{TestBroker, decide, require, seed_counts};

#[test]
fn every_broker_answers() {
    for broker in TestBroker::ALL {
        require(broker);
    }
}

#[test]
fn the_seed_story_was_written() {
    if TestBroker::ALL.iter().any(|b| require(*b).is_none()) {
        return;
    }
    let seed = seed_counts();
    assert_eq!(seed["rabbitmq"]["total"], 29);
    assert_eq!(seed["sqs"]["dlqs"]["orders-dlq"], 10);
    assert_eq!(seed["kafka"]["dlts"]["orders.DLT"]["total"], 30);
}

#[test]
fn a_missing_broker_fails_under_ci_even_when_skipping_is_asked() {
    let err =
        std::panic::catch_unwind(|| decide(TestBroker::Kafka, false, true, true)).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("Tansu (Kafka)") && msg.contains("scripts/brokers up"),
        "{msg}"
    );
}

#[test]
fn a_missing_broker_fails_outside_ci_unless_skipping_is_asked() {
    let err =
        std::panic::catch_unwind(|| decide(TestBroker::Rabbitmq, false, false, false)).unwrap_err();
    assert!(
        err.downcast_ref::<String>()
            .unwrap()
            .contains("scripts/brokers up")
    );
    assert_eq!(decide(TestBroker::Rabbitmq, false, false, true), None);
    assert!(decide(TestBroker::Sqs, true, true, false).is_some());
}
