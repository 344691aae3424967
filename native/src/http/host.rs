//! A Host field's value split into the name and port of the environ (SERVER_NAME, SERVER_PORT).

/// refork.wsgi.environ._split_host: (name, port) of a Host value.
pub(crate) fn split_host<'a>(host: &'a [u8], default_port: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    if host.first() == Some(&b'[') {
        if let Some(end) = host.iter().position(|&b| b == b']') {
            if end > 0 {
                let rest = &host[end + 1..];
                let port = if rest.first() == Some(&b':') && rest.len() > 1 { &rest[1..] } else { default_port };
                return (&host[1..end], port);
            }
        }
    }
    if let Some(colon) = host.iter().rposition(|&b| b == b':') {
        let port = &host[colon + 1..];
        if !port.is_empty() && port.iter().all(|b| b.is_ascii_digit()) {
            return (&host[..colon], port);
        }
    }
    (host, default_port)
}

#[cfg(test)]
mod tests {
    use super::split_host;

    /// refork.wsgi.environ._split_host's answers.
    #[test]
    fn name_and_port_as_the_python_environ_splits_them() {
        let cases: [(&str, &str, &str); 12] = [
            ("example.com", "example.com", "80"),
            ("example.com:8080", "example.com", "8080"),
            ("example.com:", "example.com:", "80"),
            ("example.com:http", "example.com:http", "80"),
            ("a:b:8", "a:b", "8"),
            ("[::1]", "::1", "80"),
            ("[::1]:8000", "::1", "8000"),
            ("[::1]:", "::1", "80"),
            ("[::1]x", "::1", "80"),
            ("[]:1", "", "1"),
            ("[::1", "[:", "1"),
            ("", "", "80"),
        ];
        for (host, name, port) in cases {
            let (n, p) = split_host(host.as_bytes(), b"80");
            assert_eq!((n, p), (name.as_bytes(), port.as_bytes()), "{host:?}");
        }
    }
}
