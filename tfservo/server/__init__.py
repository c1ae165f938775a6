"""Server processes: run one, supervise workers, graceful shutdown, listeners, --reload, and the
loopback endpoints handlers call. Above the doors, which it assembles."""
