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
        std::panic::catch_unwind(|| decide(TestBroker::Kafka.name(), TestBroker::Kafka.addr(), false, true, true))
            .unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("Tansu (Kafka)") && msg.contains("scripts/brokers up"), "{msg}");
}

#[test]
fn a_missing_broker_fails_outside_ci_unless_skipping_is_asked() {
    let err = std::panic::catch_unwind(|| {
        decide(TestBroker::Rabbitmq.name(), TestBroker::Rabbitmq.addr(), false, false, false)
    })
    .unwrap_err();
    assert!(err.downcast_ref::<String>().unwrap().contains("scripts/brokers up"));
    assert_eq!(decide(TestBroker::Rabbitmq.name(), TestBroker::Rabbitmq.addr(), false, false, true), None);
    assert!(decide(TestBroker::Sqs.name(), TestBroker::Sqs.addr(), true, true, false).is_some());
}

#[test]
fn fixtures_make_isolated_dlqs_of_real_dead_letters() {
    let letters: Vec<dlqctl::model::DeadLetter> = (0..3)
        .map(|i| dlqctl::model::DeadLetter {
            id: format!("f-{i}"),
            headers: dlqctl::model::Headers::new().with("seq", i as i64),
            body: Some(format!("body {i}").into_bytes()),
            ..Default::default()
        })
        .collect();
    for broker in TestBroker::ALL {
        if require(broker).is_none() {
            continue;
        }
        let a = support::Namespace::create(broker, &letters);
        let b = support::Namespace::create(broker, &letters);
        assert_ne!(a.target, b.target, "each namespace is its own");
        let target = dlqctl::target::Target::parse(&a.target).unwrap();
        assert!(target.names_a_dlq(), "{}", a.target);
        assert_eq!(target.scheme(), broker.key());
    }
}
