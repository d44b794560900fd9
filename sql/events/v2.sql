/*
# Fix: event_date is the UTC date of event_ts. v1 shifted it by a fixed UTC-8 offset, which put
# every event before 08:00 UTC into the previous day's partition.
target = "events"
partition_by = "event_date"
reason = "fix timezone: event_date is the UTC date of event_ts"

[sources.raw_events]
window = "ingest_date"
lookback = 0
lookahead = 1            # events arrive up to a day late

[validate]
key = ["event_id"]
measures = ["amount_cents"]
*/
SELECT
  event_id,
  user_id,
  country,
  amount_cents,
  event_ts,
  CAST(event_ts AS DATE) AS event_date
FROM raw_events
WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end
