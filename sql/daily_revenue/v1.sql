/*
# Revenue and event counts per day and country.
target = "daily_revenue"
partition_by = "event_date"
reason = "daily revenue per country"

[sources.events]
window = "event_date"

[validate]
key = ["event_date", "country"]
measures = ["revenue_cents", "events"]
*/
SELECT
  event_date,
  country,
  SUM(amount_cents) AS revenue_cents,
  COUNT(*) AS events
FROM events
GROUP BY event_date, country
