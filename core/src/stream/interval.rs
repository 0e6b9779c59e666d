//! Durations in streaming SQL and options: `INTERVAL '5' SECOND`, `INTERVAL '1 minute'`,
//! `'0.5 ms'`, and interval literals handed to the window table functions.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::Expr;

use crate::error::{Result, SpateError};

/// Microseconds in one of the units written after a number, or `None` for an unknown unit.
fn unit_micros(unit: &str) -> Option<f64> {
    let unit = unit.to_ascii_lowercase();
    // Short forms exactly; long forms with or without a plural "s".
    let short = match unit.as_str() {
        "us" | "µs" => Some(1.0),
        "ms" => Some(1e3),
        "s" => Some(1e6),
        "m" | "min" | "mins" => Some(60e6),
        "h" | "hr" | "hrs" => Some(3_600e6),
        "d" => Some(86_400e6),
        _ => None,
    };
    short.or(match unit.strip_suffix('s').unwrap_or(&unit) {
        "microsecond" | "micro" => Some(1.0),
        "millisecond" | "milli" => Some(1e3),
        "second" | "sec" => Some(1e6),
        "minute" => Some(60e6),
        "hour" => Some(3_600e6),
        "day" => Some(86_400e6),
        _ => None,
    })
}

/// A duration written as text, in microseconds: `5 seconds`, `0.5ms`, `1 minute`, `250`
/// (seconds), or SQL's `INTERVAL '5' SECOND` / `INTERVAL '5 seconds'`.
pub fn parse_duration_micros(text: &str) -> Result<i64> {
    let bad = |why: &str| SpateError::Sql {
        message: format!("cannot read '{text}' as a duration: {why}"),
        location: None,
    };
    let mut s = text.trim();
    if s.len() >= 8 && s[..8].eq_ignore_ascii_case("interval") {
        s = s[8..].trim();
    }
    // `'5' SECOND` or `'5 seconds'`: the quoted part, then an optional unit after it.
    let (quoted, after) = match s.strip_prefix('\'') {
        Some(rest) => {
            let end = rest.find('\'').ok_or_else(|| bad("an unclosed quote"))?;
            (&rest[..end], rest[end + 1..].trim())
        }
        None => (s, ""),
    };
    let quoted = quoted.trim();
    let split = quoted
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(quoted.len());
    let (number, unit) = quoted.split_at(split);
    let unit = match (unit.trim(), after) {
        ("", "") => "second",
        ("", after) => after,
        (unit, "") => unit,
        _ => return Err(bad("two units")),
    };
    let value: f64 = number.parse().map_err(|_| bad("no number"))?;
    let per = unit_micros(unit).ok_or_else(|| {
        bad("an unknown unit (microsecond, millisecond, second, minute, hour or day)")
    })?;
    let micros = value * per;
    if !micros.is_finite() || micros < 0.0 || micros > i64::MAX as f64 / 2.0 {
        return Err(bad("out of range"));
    }
    Ok(micros.round() as i64)
}

/// An interval literal handed to a table function (`INTERVAL '1' MINUTE`), in microseconds.
/// Months have no fixed length, so an interval with months is refused.
pub fn interval_expr_micros(expr: &Expr, what: &str) -> Result<i64> {
    let bad = || SpateError::Sql {
        message: format!("{what} must be an interval such as INTERVAL '1' MINUTE, not `{expr}`"),
        location: None,
    };
    let Expr::Literal(value, _) = expr else {
        return Err(bad());
    };
    let nanos: i128 = match value {
        ScalarValue::IntervalMonthDayNano(Some(v)) if v.months == 0 => {
            i128::from(v.days) * 86_400_000_000_000 + i128::from(v.nanoseconds)
        }
        ScalarValue::IntervalDayTime(Some(v)) => {
            i128::from(v.days) * 86_400_000_000_000 + i128::from(v.milliseconds) * 1_000_000
        }
        ScalarValue::DurationMicrosecond(Some(v)) => i128::from(*v) * 1_000,
        ScalarValue::DurationMillisecond(Some(v)) => i128::from(*v) * 1_000_000,
        ScalarValue::DurationSecond(Some(v)) => i128::from(*v) * 1_000_000_000,
        ScalarValue::DurationNanosecond(Some(v)) => i128::from(*v),
        ScalarValue::Utf8(Some(s)) => i128::from(parse_duration_micros(s)?) * 1_000,
        _ => return Err(bad()),
    };
    if nanos <= 0 || nanos % 1_000 != 0 {
        return Err(SpateError::Sql {
            message: format!("{what} must be a positive whole number of microseconds"),
            location: None,
        });
    }
    i64::try_from(nanos / 1_000).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_sql_intervals_and_short_forms() {
        assert_eq!(
            parse_duration_micros("INTERVAL '5' SECOND").unwrap(),
            5_000_000
        );
        assert_eq!(
            parse_duration_micros("interval '1 minute'").unwrap(),
            60_000_000
        );
        assert_eq!(parse_duration_micros("0.5ms").unwrap(), 500);
        assert_eq!(parse_duration_micros("'2' HOURS").unwrap(), 7_200_000_000);
        assert_eq!(parse_duration_micros("3").unwrap(), 3_000_000);
        assert_eq!(parse_duration_micros("250 us").unwrap(), 250);
        assert_eq!(parse_duration_micros("5m").unwrap(), 300_000_000);
        assert_eq!(parse_duration_micros("2 mins").unwrap(), 120_000_000);
        assert_eq!(parse_duration_micros("1 hours").unwrap(), 3_600_000_000);
        // A window of no length is refused where a window is asked for.
        assert!(
            interval_expr_micros(
                &Expr::Literal(ScalarValue::Utf8(Some("0 s".into())), None),
                "a size"
            )
            .is_err()
        );
        assert!(parse_duration_micros("5 fortnights").is_err());
        assert!(parse_duration_micros("-1 s").is_err());
    }
}
