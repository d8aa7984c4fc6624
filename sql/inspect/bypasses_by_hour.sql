-- Which flows used the deadline bypass, and when? (Bypasses are granted
-- outside the quota; a steady stream means deadlines are set too tight.)
SELECT window_start, quota, flow, bypassed
FROM bypasses_by_hour
ORDER BY window_start DESC, bypassed DESC;
