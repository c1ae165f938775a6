-- wrk script: POST the file $BENCH_BODY (Content-Type $BENCH_CONTENT_TYPE) on every request and
-- print one JSON line of results (latencies in microseconds; status = non-2xx/3xx answers).
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = os.getenv("BENCH_CONTENT_TYPE") or "application/json"
-- $BENCH_DELAY_MS: each connection waits that long between requests (a paced, below-saturation load)
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if pause > 0 then
  delay = function() return pause end
end
if os.getenv("BENCH_AUTHORIZATION") then
  wrk.headers["Authorization"] = os.getenv("BENCH_AUTHORIZATION")
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
