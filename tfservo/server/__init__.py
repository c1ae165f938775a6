"""Server processes: start and supervise workers, graceful shutdown, listeners, the loopback
endpoints handlers call, and the metrics every door shares."""
