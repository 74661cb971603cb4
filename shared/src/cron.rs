//! 5-field cron schedules (minute hour day-of-month month day-of-week, UTC), as Kubernetes
//! CronJobs write them, evaluated against a time the caller passes in so schedules are testable.
//!
//! Semantics follow Vixie cron: names for months and weekdays, `7` is Sunday, `a/n` means
//! `a-max/n`, and when both day fields are restricted a day matching either one fires.

use k8s_openapi::jiff::civil::{Date, DateTime};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days_of_month: u32,
    months: u16,
    days_of_week: u8,
    /// The day-of-month field is not `*`-based: it restricts the days.
    day_of_month_restricted: bool,
    /// The day-of-week field is not `*`-based.
    day_of_week_restricted: bool,
}

/// Why an expression is not a schedule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CronError(String);

/// How far a search for the next or previous run looks: the longest gap between two runs of any
/// schedule is between two February 29ths around a century year that is not a leap year (8).
const SEARCH_YEARS: i16 = 9;

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
};
/// 0–7, both ends Sunday.
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
};

impl Schedule {
    /// Parse a 5-field expression or one of `@yearly`, `@annually`, `@monthly`, `@weekly`,
    /// `@daily`, `@midnight`, `@hourly`.
    pub fn parse(expression: &str) -> Result<Schedule, CronError> {
        let trimmed = expression.trim();
        let expanded = match trimmed {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(CronError(format!(
                    "{other:?} is not a schedule: use 5 fields or @yearly, @monthly, @weekly, \
                     @daily or @hourly"
                )));
            }
            other if other.starts_with("TZ=") || other.starts_with("CRON_TZ=") => {
                return Err(CronError(
                    "schedules are in UTC: remove the time zone prefix".into(),
                ));
            }
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(CronError(format!(
                "{trimmed:?} has {} fields; a schedule has 5: minute hour day-of-month month \
                 day-of-week (e.g. \"0 3 * * *\" for 03:00 UTC every day)",
                fields.len()
            )));
        }
        let minutes = parse_field(fields[0], &MINUTE)?;
        let hours = parse_field(fields[1], &HOUR)?;
        let days_of_month = parse_field(fields[2], &DAY_OF_MONTH)?;
        let months = parse_field(fields[3], &MONTH)?;
        let mut days_of_week = parse_field(fields[4], &DAY_OF_WEEK)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week | 1) & !(1 << 7);
        }
        let schedule = Schedule {
            minutes,
            hours: u32::try_from(hours).unwrap_or(0),
            days_of_month: u32::try_from(days_of_month).unwrap_or(0),
            months: u16::try_from(months).unwrap_or(0),
            days_of_week: u8::try_from(days_of_week).unwrap_or(0),
            day_of_month_restricted: !fields[2].starts_with('*'),
            day_of_week_restricted: !fields[4].starts_with('*'),
        };
        let start = Date::constant(2000, 1, 1).at(0, 0, 0, 0);
        if schedule.next_local(start).is_none() {
            return Err(CronError(format!(
                "{trimmed:?} never runs (no such day in any month)"
            )));
        }
        Ok(schedule)
    }

    /// The first run strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let local = TimeZone::UTC.to_datetime(after);
        let start = minute_floor(local).checked_add(1.minute()).ok()?;
        self.next_local(start).and_then(to_timestamp)
    }

    /// The last run at or before `at`.
    pub fn last_at_or_before(&self, at: Timestamp) -> Option<Timestamp> {
        let local = minute_floor(TimeZone::UTC.to_datetime(at));
        self.previous_local(local).and_then(to_timestamp)
    }

    fn matches_day(&self, date: Date) -> bool {
        let dom = bit(u64::from(self.days_of_month), date.day() as u32);
        let dow = bit(
            u64::from(self.days_of_week),
            date.weekday().to_sunday_zero_offset() as u32,
        );
        if self.day_of_month_restricted && self.day_of_week_restricted {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// The first matching minute at or after `t`.
    fn next_local(&self, mut t: DateTime) -> Option<DateTime> {
        let limit = t.date().year().checked_add(SEARCH_YEARS)?;
        while t.year() <= limit {
            t = if !bit(u64::from(self.months), t.month() as u32) {
                first_of_next_month(t.date())?
            } else if !self.matches_day(t.date()) {
                t.date().tomorrow().ok()?.at(0, 0, 0, 0)
            } else if !bit(u64::from(self.hours), t.hour() as u32) {
                t.date().at(t.hour(), 0, 0, 0).checked_add(1.hour()).ok()?
            } else if !bit(self.minutes, t.minute() as u32) {
                t.checked_add(1.minute()).ok()?
            } else {
                return Some(t);
            };
        }
        None
    }

    /// The last matching minute at or before `t`.
    fn previous_local(&self, mut t: DateTime) -> Option<DateTime> {
        let limit = t.date().year().checked_sub(SEARCH_YEARS)?;
        while t.year() >= limit {
            t = if !bit(u64::from(self.months), t.month() as u32) {
                t.date()
                    .first_of_month()
                    .at(0, 0, 0, 0)
                    .checked_sub(1.minute())
                    .ok()?
            } else if !self.matches_day(t.date()) {
                t.date().at(0, 0, 0, 0).checked_sub(1.minute()).ok()?
            } else if !bit(u64::from(self.hours), t.hour() as u32) {
                t.date().at(t.hour(), 0, 0, 0).checked_sub(1.minute()).ok()?
            } else if !bit(self.minutes, t.minute() as u32) {
                t.checked_sub(1.minute()).ok()?
            } else {
                return Some(t);
            };
        }
        None
    }
}

fn bit(set: u64, n: u32) -> bool {
    n < 64 && set & (1 << n) != 0
}

fn minute_floor(t: DateTime) -> DateTime {
    t.date().at(t.hour(), t.minute(), 0, 0)
}

fn first_of_next_month(date: Date) -> Option<DateTime> {
    Some(date.first_of_month().checked_add(1.month()).ok()?.at(0, 0, 0, 0))
}

fn to_timestamp(t: DateTime) -> Option<Timestamp> {
    TimeZone::UTC.to_timestamp(t).ok()
}

/// The set of values one field allows, as bits.
fn parse_field(text: &str, field: &Field) -> Result<u64, CronError> {
    let fail = |why: String| CronError(format!("{} field {text:?}: {why}", field.name));
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step
                    .parse()
                    .map_err(|_| fail(format!("step {step:?} is not a number")))?;
                if step == 0 {
                    return Err(fail("a step must be at least 1".into()));
                }
                (range, step)
            }
            None => (item, 1),
        };
        let (low, high) = if range == "*" {
            (field.min, field.max)
        } else if let Some((low, high)) = range.split_once('-') {
            (
                value(low, field).map_err(fail)?,
                value(high, field).map_err(fail)?,
            )
        } else {
            let low = value(range, field).map_err(fail)?;
            (low, if step > 1 { field.max } else { low })
        };
        if low > high {
            return Err(fail(format!("range {low}-{high} runs backwards")));
        }
        // A step beyond the field's range (`1/4294967295`) selects its start alone: the next
        // value would overflow, and past the range it selects nothing anyway.
        let mut v = Some(low);
        while let Some(value) = v.filter(|value| *value <= high) {
            set |= 1 << value;
            v = value.checked_add(step);
        }
    }
    Ok(set)
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    if text.is_empty() {
        return Err("an empty value".into());
    }
    let upper = text.to_ascii_uppercase();
    let number = match field.names.iter().position(|n| *n == upper) {
        Some(index) => index as u32 + if field.min == 1 { 1 } else { 0 },
        None => text.parse::<u32>().map_err(|_| {
            let names = if field.names.is_empty() {
                String::new()
            } else {
                format!(" or a name ({}..)", field.names[..3].join(", "))
            };
            format!("{text:?} is not a number{names}")
        })?,
    };
    if number < field.min || number > field.max {
        return Err(format!("{number} is out of range {}-{}", field.min, field.max));
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn next(expression: &str, after: &str) -> String {
        Schedule::parse(expression)
            .unwrap()
            .next_after(at(after))
            .unwrap()
            .to_string()
    }

    fn last(expression: &str, at_or_before: &str) -> String {
        Schedule::parse(expression)
            .unwrap()
            .last_at_or_before(at(at_or_before))
            .unwrap()
            .to_string()
    }

    #[test]
    fn next_runs_for_common_schedules() {
        for (expression, after, expected) in [
            ("*/15 * * * *", "2026-01-01T10:07:30Z", "2026-01-01T10:15:00Z"),
            ("*/15 * * * *", "2026-01-01T10:15:00Z", "2026-01-01T10:30:00Z"),
            ("* * * * *", "2026-01-01T10:15:59.9Z", "2026-01-01T10:16:00Z"),
            ("0 3 * * *", "2026-01-01T03:00:00Z", "2026-01-02T03:00:00Z"),
            ("0 3 * * *", "2026-01-31T04:00:00Z", "2026-02-01T03:00:00Z"),
            ("@hourly", "2026-12-31T23:30:00Z", "2027-01-01T00:00:00Z"),
            ("@daily", "2026-03-10T12:00:00Z", "2026-03-11T00:00:00Z"),
            ("@weekly", "2026-11-24T12:00:00Z", "2026-11-29T00:00:00Z"),
            ("@monthly", "2026-11-24T12:00:00Z", "2026-12-01T00:00:00Z"),
            ("@yearly", "2026-11-24T12:00:00Z", "2027-01-01T00:00:00Z"),
            // 2026-11-24 is a Tuesday.
            ("30 2 * * 1-5", "2026-11-28T00:00:00Z", "2026-11-30T02:30:00Z"),
            ("30 2 * * MON-FRI", "2026-11-28T00:00:00Z", "2026-11-30T02:30:00Z"),
            ("0 0 * * 7", "2026-11-24T00:00:00Z", "2026-11-29T00:00:00Z"),
            ("0 0 * * sun", "2026-11-24T00:00:00Z", "2026-11-29T00:00:00Z"),
            ("0 12 1 jan,jul *", "2026-02-01T00:00:00Z", "2026-07-01T12:00:00Z"),
            ("5/20 * * * *", "2026-01-01T10:26:00Z", "2026-01-01T10:45:00Z"),
            ("0 0 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"),
            (
                "0-10/5,40 8 * * *",
                "2026-01-01T08:06:00Z",
                "2026-01-01T08:10:00Z",
            ),
        ] {
            assert_eq!(next(expression, after), expected, "{expression} after {after}");
        }
    }

    #[test]
    fn both_day_fields_restricted_means_either_day() {
        // The 13th, or any Friday: 2026-11-27 is a Friday, before 2026-12-13.
        assert_eq!(next("0 0 13 * 5", "2026-11-24T00:00:00Z"), "2026-11-27T00:00:00Z");
        // A `*`-based day of week leaves the day of month alone.
        assert_eq!(
            next("0 0 13 * */1", "2026-11-24T00:00:00Z"),
            "2026-12-13T00:00:00Z"
        );
    }

    #[test]
    fn the_last_run_at_or_before_a_time() {
        for (expression, at_or_before, expected) in [
            ("*/15 * * * *", "2026-01-01T10:07:30Z", "2026-01-01T10:00:00Z"),
            ("*/15 * * * *", "2026-01-01T10:15:00Z", "2026-01-01T10:15:00Z"),
            ("0 3 * * *", "2026-01-01T02:59:00Z", "2025-12-31T03:00:00Z"),
            ("0 0 1 * *", "2026-03-15T00:00:00Z", "2026-03-01T00:00:00Z"),
            ("30 2 * * 1-5", "2026-11-30T01:00:00Z", "2026-11-27T02:30:00Z"),
            ("0 0 29 2 *", "2027-06-01T00:00:00Z", "2024-02-29T00:00:00Z"),
        ] {
            assert_eq!(
                last(expression, at_or_before),
                expected,
                "{expression} at {at_or_before}"
            );
        }
    }

    #[test]
    fn next_and_last_agree_over_a_day_of_minutes() {
        let schedule = Schedule::parse("7,37 */3 * * *").unwrap();
        let mut t = at("2026-05-01T00:00:00Z");
        let mut runs = 0;
        while t < at("2026-05-02T00:00:00Z") {
            let next = schedule.next_after(t).unwrap();
            assert_eq!(schedule.last_at_or_before(next), Some(next));
            assert!(schedule.last_at_or_before(t).is_none_or(|last| last <= t));
            t = next;
            runs += 1;
        }
        assert_eq!(
            runs, 17,
            "8 hours × 2 minutes, plus the first run of the next day"
        );
    }

    #[test]
    fn steps_as_large_as_a_number_can_be_select_the_start_alone() {
        for expression in [
            "1/4294967295 * * * *",
            "0-59/4294967295 * * * *",
            "* */4294967295 * * *",
        ] {
            assert!(Schedule::parse(expression).is_ok(), "{expression}");
        }
        assert_eq!(
            next("1/4294967295 * * * *", "2026-01-01T10:07:30Z"),
            "2026-01-01T11:01:00Z"
        );
        let error = Schedule::parse("*/4294967296 * * * *").unwrap_err().to_string();
        assert!(error.contains("is not a number"), "{error}");
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (expression, words) in [
            ("* * * *", "has 4 fields"),
            ("* * * * * *", "has 6 fields"),
            ("", "has 0 fields"),
            ("60 * * * *", "minute field \"60\": 60 is out of range 0-59"),
            ("* 24 * * *", "hour field"),
            ("* * 0 * *", "day of month field \"0\": 0 is out of range 1-31"),
            ("* * * 13 *", "month field"),
            ("* * * * 8", "day of week field"),
            (
                "* * * FOO *",
                "\"FOO\" is not a number or a name (JAN, FEB, MAR..)",
            ),
            ("*/0 * * * *", "a step must be at least 1"),
            ("*/x * * * *", "step \"x\" is not a number"),
            ("10-5 * * * *", "range 10-5 runs backwards"),
            ("1,,2 * * * *", "an empty value"),
            ("0 0 30 2 *", "never runs"),
            ("@reboot", "is not a schedule"),
            ("@every 5m", "is not a schedule"),
            ("TZ=Europe/Paris 0 3 * * *", "schedules are in UTC"),
        ] {
            let error = Schedule::parse(expression).unwrap_err().to_string();
            assert!(error.contains(words), "{expression:?}: {error}");
        }
    }
}
