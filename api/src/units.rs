//! Durations and quantities as Kubernetes users write them.
//!
//! Durations use Go's notation restricted to whole numbers (`100ms`, `30s`, `1h30m`), the same
//! one Kubernetes' CEL `duration()` understands, so CRD rules and Rust agree on what a value
//! means. Quantities use Kubernetes' suffixes (`512Mi`, `1Gi`, `10G`).

use std::time::Duration;

/// The JSON-schema pattern of a duration: one or more `<digits><unit>` with unit ms, s, m or h.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// Parses `100ms`, `30s`, `5m`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("{s:?} is not a duration (write it like 100ms, 30s, 5m or 1h30m)");
    if s.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(err());
        };
        total += unit * u32::try_from(n).map_err(|_| err())?;
        rest = &rest[len..];
    }
    Ok(total)
}

/// Writes a duration the way [`parse_duration`] reads it (`1h30m`, `100ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, ms) = (rest / 1000, rest % 1000);
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s"), (ms, "ms")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

/// The JSON-schema pattern of a byte quantity (a subset of Kubernetes' quantity syntax).
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$";

/// Parses a Kubernetes byte quantity such as `512Mi`, `1.5Gi`, `10G` or `1048576`.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a quantity (write it like 512Mi or 2Gi)"))?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        other => return Err(format!("{s:?}: unsupported quantity suffix {other:?}")),
    };
    Ok((n * mult).round() as u64)
}

/// Writes bytes in the largest binary unit that divides them (`64Mi`, `1Gi`, `1000`).
pub fn format_quantity(bytes: u64) -> String {
    for (unit, size) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go_and_cel() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2m5s"), Ok(Duration::from_secs(125)));
        for bad in ["", "1", "h", "1d", "1.5h", "-1s", "10 s"] {
            assert!(parse_duration(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn durations_round_trip() {
        for s in ["100ms", "1h", "1h30m", "45s", "1m1s500ms"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }

    #[test]
    fn quantities_use_kubernetes_suffixes() {
        assert_eq!(parse_quantity("512Mi"), Ok(512 << 20));
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_quantity("10G"), Ok(10_000_000_000));
        assert_eq!(parse_quantity("4096"), Ok(4096));
        assert!(parse_quantity("5Xi").is_err());
        assert_eq!(format_quantity(64 << 20), "64Mi");
        assert_eq!(format_quantity(1000), "1000");
    }
}
