//! Amounts as people read and write them: sizes, fuel and durations, in
//! messages and in configuration files. The ground floor: every layer may
//! use it, and it uses none of them. Parsers return the message to show
//! (naming the key and the value given); callers wrap it in their own error.

use std::time::Duration;

/// `268435456` -> `"256 MiB"`, `1536` -> `"1.5 KiB"`: the largest binary unit
/// that fits, exact when it divides evenly.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    let (name, size) = UNITS
        .iter()
        .copied()
        .find(|(_, size)| bytes >= *size)
        .unwrap_or(("B", 1));
    if bytes.is_multiple_of(size) {
        format!("{} {name}", bytes / size)
    } else {
        format!("{:.1} {name}", bytes as f64 / size as f64)
    }
}

/// A metric's value for a table or a line: four decimals where that is
/// short (`0.1234`, `-512.0000`), else scientific (`1.2346e308`,
/// `3.0000e-7`), so that a guest's huge value cannot widen a terminal
/// table past its lines.
pub fn metric_text(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 || !value.is_finite() || (1e-4..1e6).contains(&magnitude) {
        format!("{value:.4}")
    } else {
        format!("{value:.4e}")
    }
}

/// Fuel amounts as people write them in configs: `5e9`, `2.5e10`, `1000`.
pub fn fuel_text(fuel: u64) -> String {
    if fuel < 100_000 {
        return fuel.to_string();
    }
    let exponent = (fuel as f64).log10().floor() as i32;
    let mantissa = fuel as f64 / 10f64.powi(exponent);
    let mantissa = format!("{mantissa:.2}");
    let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
    format!("{mantissa}e{exponent}")
}

/// `5e9`, `5_000_000_000`, `"5e9"`, or `"unlimited"`.
pub fn fuel(value: &toml::Value, key: &str) -> Result<Option<u64>, String> {
    let err = || {
        format!(
            "{key} must be a positive amount of fuel such as 5e9, or \"unlimited\"; got {value}"
        )
    };
    let number = match value {
        toml::Value::Integer(i) => *i as f64,
        toml::Value::Float(f) => *f,
        toml::Value::String(s) if matches!(s.trim(), "unlimited" | "none") => return Ok(None),
        toml::Value::String(s) => s
            .trim()
            .replace('_', "")
            .parse::<f64>()
            .map_err(|_| err())?,
        _ => return Err(err()),
    };
    if (1.0..1.8e19).contains(&number) {
        Ok(Some(number as u64))
    } else {
        Err(err())
    }
}

/// `268435456`, `"256MiB"`, `"1 GiB"`, `"500MB"`.
pub fn size(value: &toml::Value, key: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "{key} must be a size such as \"256MiB\", \"2GiB\" or a number of bytes; got {value}"
        )
    };
    let bytes = match value {
        toml::Value::Integer(i) if *i > 0 => *i as u64,
        toml::Value::String(s) => parse_size(s).ok_or_else(err)?,
        _ => return Err(err()),
    };
    if bytes == 0 {
        return Err(err());
    }
    Ok(bytes)
}

/// `"256MiB"`, `"1 GiB"`, `"500MB"`, `"1024"`: a size in bytes, if it is one.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    let bytes = number * scale as f64;
    (1.0..1.8e19).contains(&bytes).then_some(bytes as u64)
}

/// The longest duration [`duration`] takes: 100 years of 365.25 days, as
/// `"100years"` reads. A longer one is surely a slip of a few zeros, and
/// from about 3e11 years on, now plus it is past what the clock can hold,
/// so a deadline set with it would panic. No limit is written `"none"`.
pub const LONGEST_DURATION: Duration = Duration::from_secs(36_525 * 24 * 60 * 60);

/// `30` (seconds), `"30s"`, `"2m"`, `"1h 30m"`, or `"none"`; at most
/// [`LONGEST_DURATION`].
pub fn duration(value: &toml::Value, key: &str) -> Result<Option<Duration>, String> {
    let err = || {
        format!(
            "{key} must be a duration such as \"30s\" or \"5m\", a number of seconds, or \"none\"; got {value}"
        )
    };
    let seconds = |secs: f64| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
    let d = match value {
        toml::Value::Integer(i) if *i > 0 => Duration::from_secs(*i as u64),
        toml::Value::Float(f) if f.is_finite() && *f > 0.0 => seconds(*f),
        toml::Value::String(s) if s.trim() == "none" => return Ok(None),
        toml::Value::String(s) => match s.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs > 0.0 => seconds(secs),
            Ok(_) => return Err(err()),
            Err(_) => humantime::parse_duration(s.trim()).map_err(|_| err())?,
        },
        _ => return Err(err()),
    };
    if d.is_zero() {
        return Err(err());
    }
    if d > LONGEST_DURATION {
        return Err(format!(
            "{key} is longer than 100 years ({value}); for no limit, write \"none\""
        ));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_stay_short_at_any_magnitude() {
        assert_eq!(metric_text(0.123456), "0.1235");
        assert_eq!(metric_text(-512.0), "-512.0000");
        assert_eq!(metric_text(0.0), "0.0000");
        assert_eq!(metric_text(1e308), "1.0000e308");
        assert_eq!(metric_text(-3e-7), "-3.0000e-7");
        assert_eq!(metric_text(f64::NAN), "NaN");
        assert_eq!(metric_text(f64::NEG_INFINITY), "-inf");
        for v in [
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            123_456.789,
            9.99e5,
            1e6,
        ] {
            assert!(metric_text(v).len() <= 12, "{v}: {}", metric_text(v));
        }
    }

    #[test]
    fn durations_past_a_century_are_refused_not_a_panic() {
        let text = |s: &str| toml::Value::String(s.into());
        for value in [
            toml::Value::Float(1e20),
            toml::Value::Float(1e19),
            toml::Value::Integer(i64::MAX),
            text("1e300"),
            text("200years"),
        ] {
            let e = duration(&value, "limits.call_timeout").unwrap_err();
            assert!(
                e.starts_with("limits.call_timeout is longer than 100 years")
                    && e.contains("for no limit, write \"none\""),
                "{value}: {e}"
            );
        }
        assert_eq!(
            duration(&text("100years"), "k").unwrap(),
            Some(LONGEST_DURATION)
        );
        assert_eq!(duration(&text("none"), "k").unwrap(), None);
        assert!(duration(&text("30s"), "k").unwrap() == Some(Duration::from_secs(30)));
    }

    #[test]
    fn human_bytes_prefers_exact_units() {
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
        assert_eq!(human_bytes(7), "7 B");
    }

    #[test]
    fn fuel_is_written_the_way_configs_write_it() {
        assert_eq!(fuel_text(5_000_000_000), "5e9");
        assert_eq!(fuel_text(25_000_000_000), "2.5e10");
        assert_eq!(fuel_text(1234), "1234");
        assert_eq!(fuel_text(123_456_789), "1.23e8");
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("256MiB"), Some(256 << 20));
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_size("500MB"), Some(500_000_000));
        assert_eq!(parse_size("1.5KiB"), Some(1536));
        assert_eq!(parse_size("12"), Some(12));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size(""), None);
    }
}
