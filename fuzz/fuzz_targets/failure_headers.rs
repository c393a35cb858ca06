//! The decoders of RabbitMQ's x-death and of Spring's and Kafka Connect's failure headers,
//! fed any headers a JSON object can describe (including $bytes, $table and deep nesting).
#![no_main]
use dlqctl::broker::{kafka, rabbitmq};
use dlqctl::model::Headers;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(headers) = serde_json::from_slice::<Headers>(input) else { return };
    let _ = rabbitmq::decode_x_death(&headers);
    let _ = kafka::decode_failure_headers(&headers);
});
