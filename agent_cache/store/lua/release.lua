-- KEYS: the deployment's (store/keys.py). ARGV: tag, then the release batch.
-- needs: releases
apply_releases(2)
return 1
