//! The optional config file: named targets (so runbooks carry no credentials in URLs)
//! and default redaction rules.
//!
//! ```toml
//! [targets.prod-orders]
//! url = "rabbitmq://ops@mq.prod:5672/%2f/orders.dlq"
//! password_env = "DLQCTL_PROD_MQ_PASSWORD"
//!
//! [redact]
//! fields = ["header.authorization", "body.card.number"]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::target::{Secret, Target};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub targets: BTreeMap<String, NamedTarget>,
    #[serde(default)]
    pub redact: RedactConfig,
    /// Thresholds, severities and waivers for `lint`.
    #[serde(default)]
    pub lint: crate::lint::LintConfig,
    /// Where the file came from, for error messages.
    #[serde(skip)]
    path: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTarget {
    pub url: String,
    /// A password kept in the file itself (the file should then be mode 0600).
    #[serde(default)]
    password: Option<String>,
    /// The name of an environment variable holding the password.
    #[serde(default)]
    password_env: Option<String>,
    /// Kafka only: librdkafka properties (`security.protocol`, `sasl.mechanism`,
    /// `sasl.username`, `ssl.ca.location`, ...); the password goes in `password[_env]`.
    #[serde(default)]
    kafka: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactConfig {
    /// Fields redacted by every verb, in the `--redact` syntax.
    #[serde(default)]
    pub fields: Vec<String>,
}

impl Config {
    /// Load `explicit` (which must exist), else `$XDG_CONFIG_HOME/dlqctl/config.toml`
    /// (or `~/.config/...`) when present, else an empty config.
    pub fn load(explicit: Option<&Path>) -> Result<Config> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => match default_path() {
                Some(p) if p.exists() => p,
                _ => return Ok(Config::default()),
            },
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::io(format!("cannot read config file {} (check --config or DLQCTL_CONFIG)", path.display()), e)
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|e| parse_error(&path, &text, &e))?;
        config.path = Some(path);
        Ok(config)
    }

    /// Turn what the user typed into a target: a name under `[targets]` first, else a literal address.
    pub fn resolve(&self, input: &str) -> Result<Target> {
        let Some(named) = self.targets.get(input) else {
            return Target::parse(input);
        };
        let where_ = self.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
        let mut target = Target::parse(&named.url)
            .map_err(|e| Error::Usage(format!("target {input:?} in config file {where_}: {e}")))?;
        let password = match (&named.password, &named.password_env) {
            (Some(_), Some(_)) => {
                return Err(Error::Usage(format!(
                    "target {input:?} in config file {where_} sets both password and password_env; keep one"
                )));
            }
            (Some(p), None) => Some(p.clone()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
                Error::Usage(format!(
                    "target {input:?} takes its password from ${var}, which is not set: export it first"
                ))
            })?),
            (None, None) => None,
        };
        if !named.kafka.is_empty() && !matches!(target, Target::Kafka(_)) {
            return Err(Error::Usage(format!(
                "target {input:?} in config file {where_}: [targets.{input}.kafka] applies to kafka:// targets only"
            )));
        }
        // Any spelling of a property that holds a secret: passwords, JAAS configuration (which
        // carries one), tokens, key material.
        let holds_a_secret = |key: &str| {
            let key = key.to_ascii_lowercase();
            ["password", "secret", "jaas", "token", "key.pem", "credential"].iter().any(|s| key.contains(s))
        };
        if let Some(secret) = named.kafka.keys().find(|k| holds_a_secret(k)) {
            return Err(Error::Usage(format!(
                "target {input:?} in config file {where_}: {secret} is a secret; give the SASL password as \
                 password_env (or password) so it is masked, and keep key passwords out of the file"
            )));
        }
        if let Target::Kafka(t) = &mut target {
            t.client = named.kafka.clone();
        }
        if let Some(password) = password {
            match &mut target {
                Target::Rabbitmq(t) => t.password = Some(Secret::new(password)),
                Target::Kafka(t) => t.sasl_password = Some(Secret::new(password)),
                other => {
                    return Err(Error::Usage(format!(
                        "target {input:?} in config file {where_}: a password applies to rabbitmq:// and kafka:// \
                         targets, not {}",
                        other.scheme()
                    )));
                }
            }
        }
        Ok(target)
    }
}

fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("dlqctl").join("config.toml"))
}

/// A config file that does not parse, named by file, line and key, never by value: the value
/// may be a password (toml's own message quotes it, as in "invalid type: integer `1234`").
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> Error {
    let first = e.message().lines().next().unwrap_or_default();
    // serde quotes the offending value in "invalid type: integer `1234`, expected a string"
    // (and only names fields in "unknown field `x`").
    let without_values = if first.starts_with("invalid") {
        regex::Regex::new(r#"\s*(`[^`]*`|"[^"]*")"#).expect("valid").replace_all(first, "")
    } else {
        first.into()
    };
    let (line, key) = match e.span() {
        Some(span) => {
            let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
            let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
            let key = text[start..end].split('=').next().unwrap_or_default().trim().trim_matches('"');
            let key = if key.is_empty() || key.starts_with('[') { String::new() } else { format!(" ({key})") };
            (format!(":{}", text[..span.start].matches('\n').count() + 1), key)
        }
        None => (String::new(), String::new()),
    };
    Error::Usage(format!("config file {}{line}{key}: {without_values}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::RabbitmqTarget;

    fn config(text: &str) -> Config {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn named_target_takes_its_password_from_the_environment() {
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("DLQCTL_TEST_PW_1", "hunter2") };
        let c = config(
            r#"
            [targets.prod]
            url = "rabbitmq://ops@mq:5672/%2f/orders.dlq"
            password_env = "DLQCTL_TEST_PW_1"
            "#,
        );
        let Target::Rabbitmq(RabbitmqTarget { password, .. }) = c.resolve("prod").unwrap() else { panic!() };
        assert_eq!(password.unwrap().expose(), "hunter2");
        let shown = c.resolve("prod").unwrap().to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn missing_password_variable_is_named() {
        let c = config("[targets.p]\nurl = \"rabbitmq://ops@mq/v/q\"\npassword_env = \"DLQCTL_TEST_UNSET_VAR\"\n");
        let err = c.resolve("p").unwrap_err().to_string();
        assert!(err.contains("$DLQCTL_TEST_UNSET_VAR"), "{err}");
    }

    #[test]
    fn unnamed_input_is_parsed_literally() {
        let c = Config::default();
        assert_eq!(c.resolve("sqs://q").unwrap().scheme(), "sqs");
    }

    #[test]
    fn bad_config_file_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "[targets.a]\nurl = \"x\"\nbogus = 1\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("config.toml:3"), "{err}");
        assert!(err.contains("bogus"), "{err}");
        std::fs::write(&path, "[targets.a]\nurl = \"x\"\npassword = 12345678987\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("config.toml:3 (password)") && !err.contains("12345678987"), "{err}");
        std::fs::write(&path, "[redact]\nfields = \"never-print\"\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("(fields)") && !err.contains("never-print"), "{err}");
    }
}
