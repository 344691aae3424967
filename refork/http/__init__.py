"""Sans-IO HTTP/1.1: request parsing and response framing. No sockets, no processes."""
