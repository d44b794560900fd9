/*
# The daily events pipeline as it first shipped. BUG: it takes the date at a fixed UTC-8 offset,
# so events before 08:00 UTC land in the previous day's partition. Kept as released: never edit.
target = "events"
partition_by = "event_date"
reason = "daily events pipeline"

[sources.raw_events]
window = "ingest_date"   # raw_events is partitioned by the day an event arrived
lookback = 0
lookahead = 2            # events arrive up to a day late; the UTC-8 shift adds one more day
*/
SELECT
  event_id,
  user_id,
  country,
  amount_cents,
  event_ts,
  CAST(event_ts - INTERVAL '8 hours' AS DATE) AS event_date
FROM raw_events
WHERE CAST(event_ts - INTERVAL '8 hours' AS DATE) BETWEEN $start AND $end
