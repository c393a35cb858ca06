//! Addressing: one string names a DLQ (or, for `list` and `lint`, a whole broker).
//!
//! Parsing is ours rather than the `url` crate's because Kafka targets carry several
//! `host:port` pairs in the authority, which no URL parser accepts.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::error::{Error, Result};

/// A password or token: printable only as `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The only way to read the secret, so every use is easy to find.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Archive(ArchiveTarget),
    Rabbitmq(RabbitmqTarget),
    Sqs(SqsTarget),
    Kafka(KafkaTarget),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ArchiveTarget {
    File(PathBuf),
    Stdin,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RabbitmqTarget {
    pub user: String,
    pub password: Option<Secret>,
    pub host: String,
    pub port: u16,
    pub vhost: String,
    /// `None` names the whole vhost (for `list` and `lint`).
    pub queue: Option<String>,
    /// Management HTTP API base URL; defaults to `http://HOST:15672`.
    pub management: Option<String>,
    /// As a `--to` destination: publish to this exchange (with `routing_key`) instead of
    /// straight to `queue`.
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    /// `rabbitmqs://` or `amqps://`: AMQP over TLS, with these files.
    pub tls: Option<TlsFiles>,
}

/// PEM files for a TLS connection: a CA to trust besides the system's, and a client
/// certificate with its private key for brokers that ask for one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SqsTarget {
    /// `None` names every queue in the account and region (for `list` and `lint`).
    pub queue: Option<SqsQueue>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SqsQueue {
    Name(String),
    Url(String),
    Arn(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct KafkaTarget {
    pub bootstrap: Vec<String>,
    /// `None` names the whole cluster (for `list` and `lint`).
    pub topic: Option<String>,
    pub group: String,
    /// Which topics `list` takes for dead-letter topics (a regular expression).
    pub pattern: Option<String>,
    /// librdkafka properties from the config file (`security.protocol`, `sasl.*`, `ssl.*`):
    /// never part of the URL, never printed.
    pub client: BTreeMap<String, String>,
    /// `sasl.password`, from the config file's `password` or `password_env`.
    pub sasl_password: Option<Secret>,
}

pub const DEFAULT_KAFKA_GROUP: &str = "dlqctl";
const RABBITMQ_DEFAULT_PORT: u16 = 5672;
const RABBITMQ_TLS_DEFAULT_PORT: u16 = 5671;
const KAFKA_DEFAULT_PORT: u16 = 9092;

const FORMS: &str = "rabbitmq://USER:PASS@HOST:PORT/VHOST/QUEUE, sqs://QUEUE, an SQS queue URL or ARN, \
                     kafka://HOST:PORT/TOPIC, or a .jsonl archive";

impl Target {
    /// Parse a target string. Named targets from the config file are resolved by the caller
    /// (see [`crate::config::Config::resolve`]); this sees only literal addresses.
    pub fn parse(input: &str) -> Result<Target> {
        if input == "-" {
            return Ok(Target::Archive(ArchiveTarget::Stdin));
        }
        if input.starts_with("arn:") {
            return parse_sqs_arn(input);
        }
        let Some((scheme, rest)) = input.split_once("://") else {
            return Ok(Target::Archive(ArchiveTarget::File(PathBuf::from(input))));
        };
        let parts = UrlParts::split(rest);
        let shown = mask_input(input);
        match scheme.to_ascii_lowercase().as_str() {
            "rabbitmq" | "amqp" => parse_rabbitmq(&parts, &shown, false),
            "rabbitmqs" | "amqps" => parse_rabbitmq(&parts, &shown, true),
            "sqs" => parse_sqs(&parts, &shown),
            "http" | "https" if parts.userinfo.is_some() => Err(no_credentials_in_sqs(&shown)),
            "http" | "https" => Ok(Target::Sqs(SqsTarget {
                queue: Some(SqsQueue::Url(input.to_owned())),
                region: None,
                endpoint: None,
                prefix: None,
            })),
            "kafka" => parse_kafka(&parts, &shown),
            "file" => Ok(Target::Archive(ArchiveTarget::File(PathBuf::from(rest)))),
            other => Err(Error::Usage(format!("unknown scheme {other:?} in target {shown:?}: use {FORMS}"))),
        }
    }

    /// True when the target names one DLQ rather than a whole broker.
    pub fn names_a_dlq(&self) -> bool {
        match self {
            Target::Archive(_) => true,
            Target::Rabbitmq(t) => t.queue.is_some(),
            Target::Sqs(t) => t.queue.is_some(),
            Target::Kafka(t) => t.topic.is_some(),
        }
    }

    pub fn scheme(&self) -> &'static str {
        match self {
            Target::Archive(_) => "archive",
            Target::Rabbitmq(_) => "rabbitmq",
            Target::Sqs(_) => "sqs",
            Target::Kafka(_) => "kafka",
        }
    }
}

/// Whether two `HOST:PORT` addresses reach the same place: the same text, or names that resolve
/// to a common address (`localhost:5672` and `127.0.0.1:5672`). A name that does not resolve is
/// compared as written.
pub fn same_address(a: &str, b: &str) -> bool {
    use std::net::ToSocketAddrs;
    if a.eq_ignore_ascii_case(b) {
        return true;
    }
    match (a.to_socket_addrs(), b.to_socket_addrs()) {
        (Ok(a), Ok(b)) => {
            let a: Vec<_> = a.collect();
            b.into_iter().any(|b| a.contains(&b))
        }
        _ => false,
    }
}

/// The canonical form, with the password masked: safe for output, logs and errors.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Archive(ArchiveTarget::Stdin) => f.write_str("-"),
            Target::Archive(ArchiveTarget::File(p)) => write!(f, "{}", p.display()),
            Target::Rabbitmq(t) => {
                let scheme = if t.tls.is_some() { "rabbitmqs" } else { "rabbitmq" };
                write!(f, "{scheme}://{}", encode(&t.user))?;
                if t.password.is_some() {
                    f.write_str(":****")?;
                }
                write!(f, "@{}:{}/{}", t.host, t.port, encode(&t.vhost))?;
                if let Some(q) = &t.queue {
                    write!(f, "/{}", encode(q))?;
                }
                let tls = t.tls.clone().unwrap_or_default();
                let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string());
                let query: Vec<String> = [
                    ("management", t.management.as_deref().map(mask_input)),
                    ("exchange", t.exchange.clone()),
                    ("routing_key", t.routing_key.clone()),
                    ("cacert", path(tls.ca)),
                    ("cert", path(tls.cert)),
                    ("key", path(tls.key)),
                ]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
                .collect();
                if !query.is_empty() {
                    write!(f, "?{}", query.join("&"))?;
                }
                Ok(())
            }
            Target::Sqs(t) => {
                match &t.queue {
                    Some(SqsQueue::Url(u)) | Some(SqsQueue::Arn(u)) => return f.write_str(u),
                    Some(SqsQueue::Name(n)) => write!(f, "sqs://{n}")?,
                    None => f.write_str("sqs://")?,
                }
                let query: Vec<String> = [("region", &t.region), ("endpoint", &t.endpoint), ("prefix", &t.prefix)]
                    .into_iter()
                    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
                    .collect();
                if !query.is_empty() {
                    write!(f, "?{}", query.join("&"))?;
                }
                Ok(())
            }
            Target::Kafka(t) => {
                write!(f, "kafka://{}", t.bootstrap.join(","))?;
                if let Some(topic) = &t.topic {
                    write!(f, "/{topic}")?;
                }
                if t.group != DEFAULT_KAFKA_GROUP {
                    write!(f, "?group={}", t.group)?;
                }
                Ok(())
            }
        }
    }
}

/// Characters escaped in a printed vhost or queue name, so the printed target parses back.
const PATH_SEGMENT: &AsciiSet = &CONTROLS.add(b'/').add(b'%').add(b'?').add(b'#').add(b' ').add(b'@').add(b':');

fn encode(s: &str) -> String {
    utf8_percent_encode(s, PATH_SEGMENT).to_string()
}

fn decode(s: &str, what: &str, shown: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| Error::Usage(format!("{what} {s:?} in target {shown:?} is not valid percent-encoded UTF-8")))
}

/// Replace the password part of `scheme://user:password@host...` with `****`. Errors echo
/// what the user typed, often malformed (extra slashes, an unencoded `/` in the password), so
/// everything between the first `:` and the last `@` counts as the password.
pub fn mask_input(input: &str) -> String {
    let Some((scheme, rest)) = input.split_once("://") else {
        // A scheme with one slash (`rabbitmq:/u:pw@host`) is read as a file name, and echoed:
        // what stands between its first `:` and its last `@` may still be a password.
        return match (input.find(':'), input.rfind('@')) {
            (Some(colon), Some(at)) if colon < at => format!("{}:****{}", &input[..colon], &input[at..]),
            _ => input.to_owned(),
        };
    };
    let Some(at) = rest.rfind('@') else {
        return input.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!("{scheme}://{}:****{}", &rest[..colon], &rest[at..]),
        // A user alone is shown, unless it may hide a password: percent-encoded (`u%3Apw`), or in
        // an http(s) URL, where no user belongs and a token alone is the secret.
        None if rest[..at].contains('%')
            || scheme.eq_ignore_ascii_case("http")
            || scheme.eq_ignore_ascii_case("https") =>
        {
            format!("{scheme}://****{}", &rest[at..])
        }
        None => input.to_owned(),
    }
}

struct UrlParts<'a> {
    userinfo: Option<&'a str>,
    hosts: &'a str,
    path: &'a str,
    query: &'a str,
}

impl<'a> UrlParts<'a> {
    fn split(rest: &'a str) -> Self {
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        UrlParts { userinfo, hosts, path, query }
    }

    fn path_segments(&self) -> Vec<&'a str> {
        self.path.split('/').filter(|s| !s.is_empty()).collect()
    }

    /// `key=value` pairs; a key outside `allowed` is an error naming it.
    fn query_pairs(&self, allowed: &[&str], shown: &str) -> Result<Vec<(&'a str, String)>> {
        let mut pairs = Vec::new();
        for pair in self.query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !allowed.contains(&key) {
                return Err(Error::Usage(format!(
                    "unknown option {key:?} in target {shown:?}: expected {}",
                    allowed.join(", ")
                )));
            }
            pairs.push((key, decode(value, key, shown)?));
        }
        Ok(pairs)
    }
}

fn parse_host_port(hostport: &str, default_port: u16, shown: &str) -> Result<(String, u16)> {
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => (h, Some(p)),
        _ => (hostport, None),
    };
    if host.is_empty() {
        return Err(Error::Usage(format!("missing host in target {shown:?}")));
    }
    let port =
        match port {
            None => default_port,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                Error::Usage(format!("port {p:?} in target {shown:?} is not a number from 1 to 65535"))
            })?,
        };
    Ok((host.to_owned(), port))
}

fn parse_rabbitmq(parts: &UrlParts, shown: &str, tls: bool) -> Result<Target> {
    let (user, password) = match parts.userinfo {
        None => ("guest".to_owned(), None),
        Some(info) => match info.split_once(':') {
            Some((u, p)) => (decode(u, "user", shown)?, Some(Secret::new(decode(p, "password", shown)?))),
            None => (decode(info, "user", shown)?, None),
        },
    };
    let default_port = if tls { RABBITMQ_TLS_DEFAULT_PORT } else { RABBITMQ_DEFAULT_PORT };
    let (host, port) = parse_host_port(parts.hosts, default_port, shown)?;
    let segments = parts.path_segments();
    if segments.len() > 2 {
        return Err(Error::Usage(format!(
            "unexpected {:?} in target {shown:?}: expected rabbitmq://USER:PASS@HOST:PORT/VHOST/QUEUE \
             (percent-encode a / inside a vhost or queue name as %2f)",
            segments[2..].join("/")
        )));
    }
    let vhost = match segments.first() {
        Some(v) => decode(v, "vhost", shown)?,
        None => "/".to_owned(),
    };
    let queue = segments.get(1).map(|q| decode(q, "queue", shown)).transpose()?;
    if let Some(q) = &queue {
        check_amqp_name(q, "queue", shown)?;
    }
    check_amqp_name(&vhost, "vhost", shown)?;
    let mut target = RabbitmqTarget {
        user,
        password,
        host,
        port,
        vhost,
        queue,
        management: None,
        exchange: None,
        routing_key: None,
        tls: tls.then(TlsFiles::default),
    };
    let keys: &[&str] = if tls {
        &["management", "exchange", "routing_key", "cacert", "cert", "key"]
    } else {
        &["management", "exchange", "routing_key"]
    };
    for (key, value) in parts.query_pairs(keys, shown)? {
        match (key, target.tls.as_mut()) {
            ("management", _) if has_userinfo(&value) => {
                return Err(Error::Usage(format!(
                    "credentials do not belong in ?management= ({shown:?}): the management API is \
                     reached with the target's own user and password (rabbitmq://USER:PASS@HOST/…)"
                )));
            }
            ("management", _) => target.management = Some(value),
            ("exchange", _) => target.exchange = Some(value),
            ("routing_key", _) => target.routing_key = Some(value),
            ("cacert", Some(files)) => files.ca = Some(PathBuf::from(value)),
            ("cert", Some(files)) => files.cert = Some(PathBuf::from(value)),
            (_, Some(files)) => files.key = Some(PathBuf::from(value)),
            (_, None) => unreachable!("TLS keys are accepted only for a TLS target"),
        }
    }
    if let Some(files) = &target.tls
        && files.cert.is_some() != files.key.is_some()
    {
        return Err(Error::Usage(format!(
            "target {shown:?} names a client certificate without its key or a key without its certificate: \
             give both cert= and key="
        )));
    }
    for name in [&target.exchange, &target.routing_key].into_iter().flatten() {
        check_amqp_name(name, "exchange or routing key", shown)?;
    }
    Ok(Target::Rabbitmq(target))
}

/// AMQP short strings hold at most 255 bytes; refuse longer names before any client sees them.
fn check_amqp_name(name: &str, what: &str, shown: &str) -> Result<()> {
    if name.len() > 255 {
        return Err(Error::Usage(format!(
            "{what} name in target {shown:?} is {} bytes long; AMQP allows at most 255",
            name.len()
        )));
    }
    Ok(())
}

/// The refusal of a user or password anywhere in an SQS target: AWS never takes them there.
fn no_credentials_in_sqs(shown: &str) -> Error {
    Error::Usage(format!(
        "credentials do not belong in an SQS target ({shown:?}): use the AWS credential chain \
         (AWS_PROFILE, environment, SSO)"
    ))
}

/// Whether a URL carries `user[:password]@` before its host.
fn has_userinfo(url: &str) -> bool {
    url.split_once("://").is_some_and(|(_, rest)| UrlParts::split(rest).userinfo.is_some())
}

fn parse_sqs(parts: &UrlParts, shown: &str) -> Result<Target> {
    if parts.userinfo.is_some() {
        return Err(no_credentials_in_sqs(shown));
    }
    if !parts.path_segments().is_empty() {
        return Err(Error::Usage(format!(
            "unexpected path {:?} in target {shown:?}: expected sqs://QUEUE_NAME",
            parts.path
        )));
    }
    let queue = match parts.hosts {
        "" => None,
        name => {
            check_sqs_name(name, shown)?;
            Some(SqsQueue::Name(name.to_owned()))
        }
    };
    let mut target = SqsTarget { queue, region: None, endpoint: None, prefix: None };
    for (key, value) in parts.query_pairs(&["region", "endpoint", "prefix"], shown)? {
        match key {
            "region" => target.region = Some(value),
            "endpoint" if has_userinfo(&value) => return Err(no_credentials_in_sqs(shown)),
            "endpoint" => target.endpoint = Some(value),
            _ => target.prefix = Some(value),
        }
    }
    if target.prefix.is_some() && target.queue.is_some() {
        return Err(Error::Usage(format!(
            "?prefix= lists queues and goes with sqs:// alone, not with a queue name ({shown:?})"
        )));
    }
    Ok(Target::Sqs(target))
}

fn check_sqs_name(name: &str, shown: &str) -> Result<()> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    let valid = !stem.is_empty()
        && name.len() <= 80
        && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "queue name {name:?} in target {shown:?} is not a valid SQS name (1-80 letters, digits, - and _, \
             optionally ending in .fifo)"
        )))
    }
}

fn parse_sqs_arn(input: &str) -> Result<Target> {
    // arn:PARTITION:sqs:REGION:ACCOUNT:NAME
    let fields: Vec<&str> = input.split(':').collect();
    if fields.len() != 6 || fields[2] != "sqs" {
        return Err(Error::Usage(format!("{input:?} is not an SQS queue ARN (arn:aws:sqs:REGION:ACCOUNT:QUEUE)")));
    }
    check_sqs_name(fields[5], input)?;
    Ok(Target::Sqs(SqsTarget {
        queue: Some(SqsQueue::Arn(input.to_owned())),
        region: Some(fields[3].to_owned()),
        endpoint: None,
        prefix: None,
    }))
}

fn parse_kafka(parts: &UrlParts, shown: &str) -> Result<Target> {
    if parts.userinfo.is_some() {
        return Err(Error::Usage(format!(
            "credentials do not belong in a Kafka target ({shown:?}): put SASL settings in the config file"
        )));
    }
    let mut bootstrap = Vec::new();
    for hostport in parts.hosts.split(',') {
        let (host, port) = parse_host_port(hostport, KAFKA_DEFAULT_PORT, shown)?;
        bootstrap.push(format!("{host}:{port}"));
    }
    let segments = parts.path_segments();
    if segments.len() > 1 {
        return Err(Error::Usage(format!(
            "unexpected {:?} in target {shown:?}: expected kafka://HOST:PORT[,HOST:PORT]/TOPIC",
            segments[1..].join("/")
        )));
    }
    let topic = segments.first().map(|t| (*t).to_owned());
    if let Some(t) = &topic {
        let valid = t.len() <= 249 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid {
            return Err(Error::Usage(format!(
                "topic {t:?} in target {shown:?} is not a valid Kafka topic name (letters, digits, . _ -)"
            )));
        }
    }
    let mut group = DEFAULT_KAFKA_GROUP.to_owned();
    let mut pattern = None;
    for (key, value) in parts.query_pairs(&["group", "pattern"], shown)? {
        match key {
            "group" => group = value,
            _ => pattern = Some(value),
        }
    }
    Ok(Target::Kafka(KafkaTarget { bootstrap, topic, group, pattern, client: BTreeMap::new(), sasl_password: None }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn usage_error(input: &str) -> String {
        match Target::parse(input) {
            Err(Error::Usage(msg)) => msg,
            other => panic!("expected a usage error for {input:?}, got {other:?}"),
        }
    }

    #[test]
    fn rabbitmq_queue_with_encoded_vhost() {
        let Target::Rabbitmq(t) = Target::parse("rabbitmq://ops:s3cret@mq.internal:5673/%2f/orders.dlq").unwrap()
        else {
            panic!()
        };
        assert_eq!(t.user, "ops");
        assert_eq!(t.password.as_ref().unwrap().expose(), "s3cret");
        assert_eq!((t.host.as_str(), t.port), ("mq.internal", 5673));
        assert_eq!(t.vhost, "/");
        assert_eq!(t.queue.as_deref(), Some("orders.dlq"));
    }

    #[test]
    fn rabbitmq_broker_level_defaults() {
        let target = Target::parse("rabbitmq://guest:guest@localhost").unwrap();
        assert!(!target.names_a_dlq());
        let Target::Rabbitmq(t) = target else { panic!() };
        assert_eq!((t.port, t.vhost.as_str()), (5672, "/"));
    }

    #[test]
    fn rabbitmq_over_tls_with_client_certificate() {
        let Target::Rabbitmq(t) =
            Target::parse("amqps://u:p@mq/prod/q?cacert=/etc/ca.pem&cert=/etc/c.pem&key=/etc/c.key").unwrap()
        else {
            panic!()
        };
        assert_eq!(t.port, 5671, "the AMQPS port by default");
        let files = t.tls.clone().expect("TLS");
        assert_eq!(files.ca.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(files.key.as_deref(), Some(Path::new("/etc/c.key")));
        let shown = Target::Rabbitmq(t).to_string();
        assert_eq!(shown, "rabbitmqs://u:****@mq:5671/prod/q?cacert=/etc/ca.pem&cert=/etc/c.pem&key=/etc/c.key");
        assert_eq!(Target::parse(&shown.replace("****", "p")).unwrap().to_string(), shown, "parses back");
        let e = Target::parse("rabbitmqs://u:s3cret@mq/v/q?cert=/c.pem").unwrap_err().to_string();
        assert!(e.contains("give both cert= and key=") && !e.contains("s3cret"), "{e}");
        assert!(Target::parse("rabbitmq://u:p@mq/v/q?cacert=/ca.pem").is_err(), "TLS files need a TLS scheme");
    }

    #[test]
    fn rabbitmq_management_override() {
        let Target::Rabbitmq(t) = Target::parse("rabbitmq://u:p@h:5672/prod/q?management=https://mgmt:443").unwrap()
        else {
            panic!()
        };
        assert_eq!(t.management.as_deref(), Some("https://mgmt:443"));
        assert_eq!(t.vhost, "prod");
    }

    #[test]
    fn display_masks_the_password_and_parses_back() {
        let target = Target::parse("rabbitmq://ops:s3cret@mq:5672/%2f/orders.dlq").unwrap();
        let shown = target.to_string();
        assert_eq!(shown, "rabbitmq://ops:****@mq:5672/%2F/orders.dlq");
        assert!(!format!("{target:?}").contains("s3cret"));
        let Target::Rabbitmq(back) = Target::parse(&shown).unwrap() else { panic!() };
        assert_eq!(back.vhost, "/");
    }

    #[test]
    fn errors_name_the_bad_part_without_the_password() {
        let msg = usage_error("rabbitmq://ops:s3cret@mq:56x2/%2f/q");
        assert!(msg.contains("\"56x2\""), "{msg}");
        assert!(!msg.contains("s3cret"), "{msg}");
        let msg = usage_error("rabbitmq://ops:s3cret@mq/v/q/extra");
        assert!(msg.contains("\"extra\"") && !msg.contains("s3cret"), "{msg}");
        let msg = usage_error("rabbitmq://ops:s3cret@mq/v/q?tls=1");
        assert!(msg.contains("\"tls\"") && !msg.contains("s3cret"), "{msg}");
    }

    #[test]
    fn overlong_amqp_names_are_refused() {
        let long = "q".repeat(256);
        assert!(usage_error(&format!("rabbitmq://h/v/{long}")).contains("255"));
    }

    #[test]
    fn unknown_scheme_names_the_scheme_and_the_forms() {
        let msg = usage_error("redis://localhost/q");
        assert!(msg.contains("\"redis\"") && msg.contains("kafka://"), "{msg}");
    }

    #[test]
    fn sqs_forms() {
        let Target::Sqs(t) = Target::parse("sqs://orders-dlq?region=eu-west-1&endpoint=http://127.0.0.1:4566").unwrap()
        else {
            panic!()
        };
        assert_eq!(t.queue, Some(SqsQueue::Name("orders-dlq".into())));
        assert_eq!(t.region.as_deref(), Some("eu-west-1"));
        assert_eq!(t.endpoint.as_deref(), Some("http://127.0.0.1:4566"));

        assert!(!Target::parse("sqs://?prefix=orders").unwrap().names_a_dlq());
        let Target::Sqs(t) = Target::parse("arn:aws:sqs:us-east-1:123456789012:orders-dlq.fifo").unwrap() else {
            panic!()
        };
        assert_eq!(t.region.as_deref(), Some("us-east-1"));
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";
        let Target::Sqs(t) = Target::parse(url).unwrap() else { panic!() };
        assert_eq!(t.queue, Some(SqsQueue::Url(url.into())));
    }

    #[test]
    fn sqs_bad_names_and_credentials() {
        assert!(usage_error("sqs://orders dlq").contains("not a valid SQS name"));
        assert!(usage_error("sqs://key:secret@orders").contains("credential chain"));
        for hidden in ["sqs://q?endpoint=http://user:never-print@host:4566", "https://AK:never-print@host/1/q"] {
            let err = usage_error(hidden);
            assert!(err.contains("credential chain") && !err.contains("never-print"), "{err}");
        }
        let err = usage_error("rabbitmq://u:p@h/v/q?management=http://admin:never-print@h:15672");
        assert!(err.contains("do not belong in ?management=") && !err.contains("never-print"), "{err}");
        assert!(usage_error("arn:aws:sns:us-east-1:1:topic").contains("not an SQS queue ARN"));
    }

    #[test]
    fn kafka_several_bootstrap_servers_and_group() {
        let Target::Kafka(t) = Target::parse("kafka://k1:9092,k2/orders.DLT?group=ops").unwrap() else { panic!() };
        assert_eq!(t.bootstrap, ["k1:9092", "k2:9092"]);
        assert_eq!(t.topic.as_deref(), Some("orders.DLT"));
        assert_eq!(t.group, "ops");
        assert!(usage_error("kafka://k1/orders dlt").contains("not a valid Kafka topic"));
        assert!(usage_error("kafka://k1:99999/t").contains("99999"));
    }

    #[test]
    fn paths_and_stdin_are_archives() {
        assert_eq!(Target::parse("-").unwrap(), Target::Archive(ArchiveTarget::Stdin));
        assert_eq!(
            Target::parse("examples/orders-dlq.jsonl").unwrap(),
            Target::Archive(ArchiveTarget::File("examples/orders-dlq.jsonl".into()))
        );
    }

    #[test]
    fn mask_input_hides_what_may_be_a_password_in_any_spelling() {
        assert_eq!(mask_input("rabbitmq:/u:SECRET@127.0.0.1:1/v/q"), "rabbitmq:****@127.0.0.1:1/v/q");
        assert_eq!(mask_input("rabbitmq://u%3ASECRET@h/v/q"), "rabbitmq://****@h/v/q");
        assert_eq!(mask_input("https://SECRET@h/1/q"), "https://****@h/1/q");
        assert_eq!(mask_input("rabbitmq://guest@h/v/q"), "rabbitmq://guest@h/v/q");
        assert_eq!(mask_input("orders.jsonl"), "orders.jsonl");
    }

    #[test]
    fn mask_input_hides_only_the_password() {
        assert_eq!(mask_input("amqp://u:p@h/v"), "amqp://u:****@h/v");
        assert_eq!(mask_input("amqp://u@h/v"), "amqp://u@h/v");
        assert_eq!(mask_input("plain"), "plain");
    }

    /// Found by `scripts/fuzz` (target_url): malformed targets must not show their password.
    #[test]
    fn mask_input_hides_the_password_of_malformed_targets() {
        let masked = mask_input("kafka:////guest:s3cret@127.0.0.1:567ouprn=.[*DLTpa");
        assert!(!masked.contains("s3cret"), "{masked}");
        assert_eq!(mask_input("amqp://u:pa/ss@h/v"), "amqp://u:****@h/v");
        assert_eq!(mask_input("amqp://u:p@ss@h/v"), "amqp://u:****@h/v");
    }
}
