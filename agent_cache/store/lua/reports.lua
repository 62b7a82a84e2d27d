-- KEYS: the in-flight hash (declared for Redis Cluster's slot). ARGV: tag, then
-- the reports (a count, then 8 fields each: see reports_apply.lua), then the
-- release batch. Writes what a router queued since its last store write.
-- needs: releases footprint templates reports_apply
apply_releases(ARGV[1], apply_reports(ARGV[1], 2))
return 1
