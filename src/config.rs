//! The router's configuration: a TOML file (every field optional, unknown fields refused) with
//! command-line flags layered on top.
//!
//! ```toml
//! listen = "127.0.0.1:27017"
//! max_connections = 10000
//!
//! [log]
//! format = "text"
//! level = "info"
//! ```

use std::path::Path;

use serde::Deserialize;

/// Everything the router reads from its configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the router listens on for clients, `host:port`.
    pub listen: String,
    /// Most client connections open at once. A connection beyond it is accepted and closed at
    /// once (as mongod does), and logged.
    pub max_connections: usize,
    /// Length of the kernel's queue of connections not yet accepted.
    pub backlog: u32,
    /// Seconds that in-flight requests get to finish after SIGINT/SIGTERM before the
    /// remaining connections are closed.
    pub shutdown_timeout_secs: u64,
    /// Logging.
    pub log: LogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:27017".to_string(),
            max_connections: 10_000,
            backlog: 1024,
            shutdown_timeout_secs: 15,
            log: LogConfig::default(),
        }
    }
}

/// Logging settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `"text"` for people, `"json"` for log pipelines (one JSON object a line).
    pub format: LogFormat,
    /// A `tracing` filter: `"info"`, `"debug"`, `"sluice=debug,info"`, …; `RUST_LOG` wins
    /// when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid configuration in {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that the types alone do not constrain.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "max_connections must be at least 1".into(),
            ));
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "listen = {:?} is not an address of the form ip:port",
                self.listen
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c: Config = toml::from_str("max_connections = 5\n[log]\nformat = \"json\"\n").unwrap();
        assert_eq!(c.max_connections, 5);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.listen, "127.0.0.1:27017");
        c.validate().unwrap();
    }

    #[test]
    fn shipped_example_is_the_defaults() {
        let c: Config = toml::from_str(include_str!("../configs/sluice.toml")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(toml::from_str::<Config>("max_conections = 5").is_err());
        assert!(toml::from_str::<Config>("[log]\ncolour = true").is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        let c = Config {
            listen: "nowhere".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
        let c = Config {
            max_connections: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
