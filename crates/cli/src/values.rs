//! Values of command-line options that several subcommands take: sizes, rates, network ports
//! and durations, parsed for clap (errors are messages a user can act on).

use rackmem_control::api::PortSpec;
use rackmem_runtime::size::parse_size;
use std::time::Duration;

/// A size: `4GiB`, `512MiB`, `1G`, bytes.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A rate in bytes per second: a size with an optional `/s`.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    parse_size(t).map_err(|e| format!("{e} (rates are bytes per second, e.g. 10GB/s)"))
}

/// A network port of a brick or node: `NAME:RATE[:SWITCH]`.
pub fn parse_port(s: &str) -> Result<PortSpec, String> {
    let mut parts = s.split(':');
    let (Some(name), Some(rate)) = (parts.next(), parts.next()) else {
        return Err(format!(
            "`{s}`: a port is NAME:RATE[:SWITCH], e.g. p0:10GB/s or p0:10GB/s:tor-a"
        ));
    };
    let switch = parts.next().map(str::to_string);
    if parts.next().is_some() || name.is_empty() || switch.as_deref() == Some("") {
        return Err(format!("`{s}`: a port is NAME:RATE[:SWITCH]"));
    }
    Ok(PortSpec {
        name: name.to_string(),
        bandwidth_bps: parse_rate(rate)?,
        switch,
    })
}

/// `500ms`, `10s`, `2m`, `1.5s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: use e.g. 500ms, 10s, 2m"))?;
    let secs = match unit.trim() {
        "ms" => v / 1000.0,
        "" | "s" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_rates() {
        assert_eq!(parse_rate("10GB/s"), Ok(10_000_000_000));
        assert_eq!(parse_rate("1GiB"), Ok(1 << 30));
        assert!(parse_rate("fast").is_err());
        let p = parse_port("p0:10GB/s:tor-a").unwrap();
        assert_eq!(
            (p.name.as_str(), p.bandwidth_bps, p.switch.as_deref()),
            ("p0", 10_000_000_000, Some("tor-a"))
        );
        assert_eq!(parse_port("p0:1G").unwrap().switch, None);
        assert!(parse_port("p0").is_err());
        assert!(parse_port("p0:1G:a:b").is_err());
        assert!(parse_port(":1G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("1e400s").is_err());
    }
}
