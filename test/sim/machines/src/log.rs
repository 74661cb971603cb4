//! Timestamps in the format Go's `log` package prints, so stand-in output reads like the real tools'.

use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY/MM/DD HH:MM:SS` in UTC.
pub fn go_log_timestamp(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}/{month:02}/{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// A line as Go's `log.Printf` writes it.
pub fn go_log_line(message: &str) -> String {
    format!("{} {message}", go_log_timestamp(SystemTime::now()))
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_like_go_log() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(go_log_timestamp(at), "2023/11/14 22:13:20");
        assert_eq!(go_log_timestamp(UNIX_EPOCH), "1970/01/01 00:00:00");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(go_log_timestamp(leap), "2000/02/29 00:00:00");
    }
}
