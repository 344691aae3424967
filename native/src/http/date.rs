//! The Date line of a response, cached per second.

/// "Date: <IMF-fixdate>\r\n" for a Unix second (email.utils.formatdate(usegmt=True)).
fn date_line(secs: u64) -> Vec<u8> {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let days = secs / 86400;
    let rem = secs % 86400;
    let weekday = DAYS[(days % 7) as usize];
    // civil from days (Howard Hinnant's algorithm)
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "Date: {}, {:02} {} {:04} {:02}:{:02}:{:02} GMT\r\n",
        weekday,
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
    .into_bytes()
}

static DATE: std::sync::Mutex<(u64, Vec<u8>)> = std::sync::Mutex::new((0, Vec::new()));

/// The Date line, cached per second.
pub(crate) fn cached_date(out: &mut Vec<u8>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut cache = DATE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.0 != now || cache.1.is_empty() {
        *cache = (now, date_line(now));
    }
    out.extend_from_slice(&cache.1);
}

#[cfg(test)]
mod tests {
    use super::{cached_date, date_line};


    #[test]
    fn the_cached_line_is_appended_whole() {
        let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
        cached_date(&mut out);
        let line = &out[17..];
        assert!(line.starts_with(b"Date: ") && line.ends_with(b" GMT\r\n") && line.len() == 37, "{line:?}");
    }

    /// tests/vectors/date.txt, which the Python response path is held to as well.
    #[test]
    fn the_shared_vectors() {
        for row in crate::vectors::rows(include_str!("../../../tests/vectors/date.txt")) {
            let line = String::from_utf8(date_line(row[0].parse().unwrap())).unwrap();
            assert_eq!(line, format!("Date: {}\r\n", row[1]), "{row:?}");
        }
    }
}
