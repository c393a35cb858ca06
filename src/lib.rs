//! dlqctl: inspect, understand and safely replay dead letters on SQS, RabbitMQ and Kafka.

pub mod broker;
pub mod cli;
pub mod commands;
pub mod config;
pub mod error;
pub mod files;
pub mod lint;
pub mod model;
pub mod output;
pub mod redact;
pub mod redrive;
pub mod target;
