-- KEYS: the deployment's (store/keys.py). ARGV: tag, then
-- the reports (a count, then 8 fields each: see reports_apply.lua), then the
-- release batch. Writes what a router queued since its last store write.
-- needs: releases footprint templates reports_apply
apply_releases(apply_reports(2))
return 1
