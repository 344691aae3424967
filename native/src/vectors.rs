//! The shared test vectors (tests/vectors/*.txt): one table per rule that exists in Rust and in
//! Python, read by both test suites.

/// The rows of a table: its fields, split at " | ", comment and empty lines left out.
pub(crate) fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| line.split(" | ").map(|field| unescape(field.trim())).collect())
        .collect()
}

/// `\r`, `\n`, `\t` and `\0` written out, as bytes.
fn unescape(field: &str) -> String {
    field.replace("\\r", "\r").replace("\\n", "\n").replace("\\t", "\t").replace("\\0", "\0")
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_comments_and_escapes() {
        let rows = super::rows("# a comment\n\na | b\\r\\n | c\n");
        assert_eq!(rows, vec![vec!["a".to_string(), "b\r\n".to_string(), "c".to_string()]]);
    }
}
