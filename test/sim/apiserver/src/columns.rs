//! The columns of a `Table` and the ages in their cells: what the custom resources' printer
//! columns, the built-in kinds' printers and the table itself share.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::jsonpath::JsonPath;

/// One column of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// `name` for the column holding the object's name, else empty.
    pub format: String,
    pub description: String,
    /// 0 for `kubectl get`, more for `-o wide` only.
    pub priority: i32,
}

impl Column {
    /// The definition as a `Table` carries it.
    pub fn definition(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// A CRD's printer column with its path parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub column: Column,
    pub path: JsonPath,
}

impl PrinterColumn {
    /// From the CRD; a path this server cannot evaluate is refused, naming the column.
    pub fn from_crd(defined: &CustomResourceColumnDefinition) -> Result<PrinterColumn, String> {
        let path =
            JsonPath::parse(&defined.json_path).map_err(|e| format!("column {:?}: {e}", defined.name))?;
        // Without a description the real server says where the column comes from.
        let description = defined.description.clone().unwrap_or_else(|| {
            format!(
                "Custom resource definition column (in JSONPath format): {}",
                defined.json_path
            )
        });
        Ok(PrinterColumn {
            column: Column {
                name: defined.name.clone(),
                type_: defined.type_.clone(),
                format: defined.format.clone().unwrap_or_default(),
                description,
                priority: defined.priority.unwrap_or(0),
            },
            path,
        })
    }
}

/// How long ago the RFC 3339 time `t` was, as `kubectl get` shows ages (`<invalid>` if it is not
/// a time).
pub fn since(t: &str, now: Timestamp) -> String {
    match t.parse::<Timestamp>() {
        Ok(then) => human_duration(now.as_second() - then.as_second()),
        Err(_) => "<invalid>".into(),
    }
}

/// Seconds as Kubernetes abbreviates them: exact seconds under two minutes, minutes and seconds
/// under ten minutes, then coarser as the span grows (`5m`, `3h20m`, `2d4h`, `400d`, `3y12d`);
/// up to a second in the future counts as now.
pub fn human_duration(seconds: i64) -> String {
    let with = |big: i64, big_unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit}{small}{small_unit}")
        }
    };
    let (minutes, hours) = (seconds / 60, seconds / 3600);
    let days = hours / 24;
    match seconds {
        s if s < -1 => "<invalid>".into(),
        s if s < 0 => "0s".into(),
        s if s < 120 => format!("{s}s"),
        _ if minutes < 10 => with(minutes, "m", seconds % 60, "s"),
        _ if minutes < 3 * 60 => format!("{minutes}m"),
        _ if hours < 8 => with(hours, "h", minutes % 60, "m"),
        _ if hours < 48 => format!("{hours}h"),
        _ if hours < 8 * 24 => with(days, "d", hours % 24, "h"),
        _ if hours < 2 * 365 * 24 => format!("{days}d"),
        _ if hours < 8 * 365 * 24 => with(days / 365, "y", days % 365, "d"),
        _ => format!("{}y", days / 365),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubectl_shows_them() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 20 * 60, "3h20m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (52 * 3600, "2d4h"),
            (8 * 86400, "8d"),
            (400 * 86400, "400d"),
            (3 * 365 * 86400 + 12 * 86400, "3y12d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, shown) in cases {
            assert_eq!(human_duration(seconds), shown, "{seconds}");
        }
    }
}
