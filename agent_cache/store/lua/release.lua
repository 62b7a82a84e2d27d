-- KEYS: the in-flight hash (declared so Redis Cluster sends the script to the
-- deployment's slot). ARGV: tag, then the release batch.
-- needs: releases
apply_releases(ARGV[1], 2)
return 1
