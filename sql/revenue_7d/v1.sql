/*
# Revenue over the last seven days, per day and country: a window over daily_revenue, so a fix of
# one day of events reaches the six days after it here (`lakefill plan events --cascade` shows it).
target = "revenue_7d"
partition_by = "event_date"
reason = "7-day rolling revenue per country"

[sources.daily_revenue]
window = "event_date"
lookback = 6             # a day's row reads that day and the six before it

[validate]
key = ["event_date", "country"]
measures = ["revenue_7d_cents"]
*/
SELECT
  d.event_date,
  d.country,
  SUM(p.revenue_cents) AS revenue_7d_cents,
  CAST(SUM(p.revenue_cents) AS DOUBLE) / 7 AS avg_daily_revenue_cents
FROM daily_revenue d
JOIN daily_revenue p
  ON p.country = d.country
 AND p.event_date BETWEEN d.event_date - INTERVAL '6 days' AND d.event_date
WHERE d.event_date BETWEEN $start AND $end
GROUP BY d.event_date, d.country
