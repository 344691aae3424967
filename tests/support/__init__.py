"""What the tests share: servers and clients, load, fakes, request paths, waits."""
