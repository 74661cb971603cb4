//! One logging setup for every binary: `--log-format` and `-v` decide, `RUST_LOG` overrides.

use tracing_subscriber::EnvFilter;

use super::args::LogFormat;

/// The filter `-v` count selects when `RUST_LOG` is not set.
pub fn default_filter(verbosity: u8) -> &'static str {
    match verbosity {
        0 => "info",
        1 => "debug",
        _ => "trace",
    }
}

/// Install the global subscriber. Fails if one is already installed.
pub fn init(format: LogFormat, verbosity: u8) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            EnvFilter::try_new(&directives).map_err(|e| format!("RUST_LOG={directives:?}: {e}"))?
        }
        _ => EnvFilter::new(default_filter(verbosity)),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| format!("installing the logger: {e}"))
}
