//! CEL rules the CRD schemas carry for admission's checks the API server can judge itself
//! (docs/operating.md, "Bad input"): a size written as a whole number of bytes within bounds,
//! a duration with a lower bound. With them, a cluster without the webhooks refuses these too.

use kube::core::{Reason, Rule};

use crate::api::quantity::human;

/// What `parse_bytes` reads, as a regular expression: digits with an optional fraction and one
/// of its suffixes (no exponent, no milli, no E or P). No backslash: clusterctl rewrites them.
const BYTES_PATTERN: &str = "^([0-9]+([.][0-9]*)?|[.][0-9]+)(k|M|G|T|Ki|Mi|Gi|Ti)?$";

/// An int-or-string size field (`ByteQuantity`): a whole number of bytes, not negative.
pub fn bytes(field: &str) -> Rule {
    within(
        field,
        0,
        i64::MAX.unsigned_abs(),
        "a whole number of bytes: a number or a quantity such as 8Gi or 500M".into(),
    )
}

/// An int-or-string size field (`ByteQuantity`): a whole number of bytes from `min` to `max`.
pub fn bytes_within(field: &str, min: u64, max: u64) -> Rule {
    within(
        field,
        min,
        max,
        format!(
            "a whole number of bytes from {} to {}: a number or a quantity such as 8Gi or 500M",
            human(min),
            human(max)
        ),
    )
}

/// The rule of a size from `min` to `max`, a number or a quantity (the Kubernetes CEL quantity
/// library), with what it must be in words. A whole number of bytes is checked on the quantity's
/// float: exact up to 2^53 bytes (8 PiB), beyond any size here (`isInteger` refuses `1.5Gi`).
fn within(field: &str, min: u64, max: u64, must_be: String) -> Rule {
    let as_quantity = |n: u64| format!("quantity('{n}')");
    Rule::new(format!(
        "type(self) == int ? (self >= {min} && self <= {max}) : (self.matches('{BYTES_PATTERN}') && \
         isQuantity(self) && quantity(self).compareTo({}) >= 0 && quantity(self).compareTo({}) <= 0 && \
         quantity(self).asApproximateFloat() == double(int(quantity(self).asApproximateFloat())))",
        as_quantity(min),
        as_quantity(max),
    ))
    .message(format!("{field} must be {must_be}").as_str())
    .reason(Reason::FieldValueInvalid)
}

/// A Go duration string of at least `min` (`1m`).
pub fn duration_at_least(field: &str, min: &str) -> Rule {
    Rule::new(format!("duration(self) >= duration('{min}')"))
        .message(format!("{field} must be a duration of at least {min}").as_str())
        .reason(Reason::FieldValueInvalid)
}

/// A Go duration string from `min` to `max` (`5s`, `10m`).
pub fn duration_within(field: &str, min: &str, max: &str) -> Rule {
    Rule::new(format!(
        "duration(self) >= duration('{min}') && duration(self) <= duration('{max}')"
    ))
    .message(format!("{field} must be a duration from {min} to {max}").as_str())
    .reason(Reason::FieldValueInvalid)
}
