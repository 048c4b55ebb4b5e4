//! The values PerfTest's flags take, parsed as PerfTest parses them: queue arguments
//! (`k=v,...`), queue name patterns (Java's `String.format` with one integer), rates with a `k`
//! suffix for `--sweep` and `--steps`, and the random UUID that is the default routing key.

use warren_protocol::{FieldTable, FieldValue};

/// `k=v,k=v`; integers become signed 64-bit numbers (`l`), true/false booleans, the rest strings.
pub fn parse_queue_args(s: &str) -> Result<FieldTable, String> {
    let mut t = FieldTable::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "--queue-args: '{pair}' is not key=value (expected e.g. x-max-length=10)"
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(format!("--queue-args: empty key in '{pair}'"));
        }
        let value = if let Ok(n) = v.parse::<i64>() {
            FieldValue::I64(n)
        } else if v == "true" || v == "false" {
            FieldValue::Bool(v == "true")
        } else {
            FieldValue::LongStr(bytes::Bytes::copy_from_slice(v.as_bytes()))
        };
        t.insert(k, value);
    }
    Ok(t)
}

/// Java's `String.format` for the one integer argument PerfTest passes: `%d`, `%Nd`, `%0Nd`,
/// `%s` and `%%`.
pub fn format_pattern(pattern: &str, i: i64) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    let mut used = false;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut zero = false;
        let mut width = String::new();
        if chars.peek() == Some(&'0') {
            zero = true;
            chars.next();
        }
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(*d);
            chars.next();
        }
        let w: usize = if width.is_empty() {
            0
        } else {
            width
                .parse()
                .map_err(|_| format!("--queue-pattern '{pattern}': bad width"))?
        };
        match chars.next() {
            Some('d') | Some('s') => {
                used = true;
                if zero {
                    out.push_str(&format!("{i:0w$}"));
                } else {
                    out.push_str(&format!("{i:w$}"));
                }
            }
            other => {
                return Err(format!(
                    "--queue-pattern '{pattern}': unsupported conversion '%{}' (use %d, e.g. 'perf-test-%d')",
                    other.map(String::from).unwrap_or_default()
                ))
            }
        }
    }
    if !used {
        return Err(format!(
            "--queue-pattern '{pattern}' has no %d for the queue index"
        ));
    }
    Ok(out)
}

fn parse_rate(s: &str, what: &str) -> Result<f64, String> {
    let s = s.trim().replace('_', "");
    let (num, mult) = match s.strip_suffix(['k', 'K']) {
        Some(n) => (n.to_string(), 1000.0),
        None => (s.clone(), 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v * mult),
        _ => Err(format!("{what}: '{s}' is not a positive rate")),
    }
}

pub fn parse_sweep(list: &str) -> Result<Vec<Option<f64>>, String> {
    let steps = list
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| match s.trim() {
            "unlimited" | "max" => Ok(None),
            v => parse_rate(v, "--sweep").map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if steps.is_empty() {
        return Err("--sweep: no rates given".into());
    }
    Ok(steps)
}

pub fn parse_steps(spec: &str) -> Result<(f64, f64, Option<f64>), String> {
    let parts: Vec<&str> = spec.split(':').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(format!(
            "--steps '{spec}': expected FROM:BY or FROM:BY:TO (msg/s), e.g. 1000:1000:20000"
        ));
    }
    let from = parse_rate(parts[0], "--steps FROM")?;
    let by = parse_rate(parts[1], "--steps BY")?;
    let to = match parts.get(2) {
        Some(t) => Some(parse_rate(t, "--steps TO")?),
        None => None,
    };
    if let Some(t) = to {
        if t < from {
            return Err(format!("--steps: TO {t} is below FROM {from}"));
        }
    }
    Ok((from, by, to))
}

/// A random UUID (v4 layout), PerfTest's default routing key.
pub fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_formatting() {
        assert_eq!(
            format_pattern("perf-test-%d", 7).as_deref(),
            Ok("perf-test-7")
        );
        assert_eq!(format_pattern("q%04d", 7).as_deref(), Ok("q0007"));
        assert_eq!(format_pattern("q%3d", 7).as_deref(), Ok("q  7"));
        assert_eq!(format_pattern("100%%-%s", 7).as_deref(), Ok("100%-7"));
        assert!(format_pattern("q-%x", 1).is_err());
    }

    #[test]
    fn uuid_shape() {
        let u = random_uuid();
        let parts: Vec<_> = u.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12], "{u}");
        assert!(u.as_bytes()[14] == b'4');
    }
}
