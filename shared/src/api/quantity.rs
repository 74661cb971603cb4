//! A size in bytes as a Kubernetes manifest writes it: a plain number, or a quantity string
//! (`8Gi`, `500M`, `1.5Gi`). The API server stores either as given (the schema says
//! int-or-string), so both are read back.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A number of bytes, or a quantity string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteQuantity {
    Bytes(i64),
    Text(String),
}

impl ByteQuantity {
    /// The number of bytes, or why the value is not one.
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            ByteQuantity::Bytes(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative")),
            ByteQuantity::Text(text) => parse_bytes(text),
        }
    }
}

impl std::fmt::Display for ByteQuantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ByteQuantity::Bytes(n) => write!(f, "{n}"),
            ByteQuantity::Text(text) => write!(f, "{text}"),
        }
    }
}

impl JsonSchema for ByteQuantity {
    fn schema_name() -> Cow<'static, str> {
        "ByteQuantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size in bytes: a number, or a Kubernetes quantity such as 8Gi or 500M.",
            "x-kubernetes-int-or-string": true,
        })
    }
}

/// `bytes` for people: `512 B`, `16.0 MiB`, `2.0 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `<digits>[.<digits>]<suffix>` with a binary (`Ki`..`Ti`) or decimal (`k`..`T`) suffix, or none;
/// the result must be a whole number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let invalid =
        || format!("{text:?} is not a size in bytes: use a number or a quantity such as 8Gi or 500M");
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(invalid()),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 9 || fraction.contains('.') {
        return Err(invalid());
    }
    let digits = |s: &str| -> Result<u128, String> {
        if s.is_empty() {
            Ok(0)
        } else {
            s.parse::<u128>().map_err(|_| invalid())
        }
    };
    let scale = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| invalid())?);
    let scaled = digits(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(digits(fraction).ok()?))
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(invalid)?;
    if scaled % scale != 0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    u64::try_from(scaled / scale).map_err(|_| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn numbers_and_quantities_read_as_bytes() {
        for (text, bytes) in [
            ("8589934592", 8 << 30),
            ("8Gi", 8 << 30),
            ("16Mi", 16 << 20),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("2k", 2000),
            (" 1Ti ", 1 << 40),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
        assert_eq!(ByteQuantity::Bytes(1024).bytes(), Ok(1024));
        assert_eq!(
            [human(512), human(16 << 20), human(17_900_000), human(2 << 30)],
            ["512 B", "16.0 MiB", "17.1 MiB", "2.0 GiB"]
        );
        let read: ByteQuantity = serde_json::from_str("16777216").unwrap();
        assert_eq!(read.bytes(), Ok(16 << 20));
        let read: ByteQuantity = serde_json::from_str("\"2Gi\"").unwrap();
        assert_eq!(read.bytes(), Ok(2 << 30));
    }

    #[test]
    fn anything_else_is_refused_with_what_to_write() {
        for text in [
            "", "Gi", "8GB", "8 Gi", "1.5", "0.0001k", "-1", "1e9", "8gi", "1..5Mi",
        ] {
            assert!(parse_bytes(text).is_err(), "{text}");
        }
        assert!(ByteQuantity::Bytes(-5).bytes().is_err());
        assert!(parse_bytes("99999999999Ti").unwrap_err().contains("too large"));
    }
}
