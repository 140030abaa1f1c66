"""Where information flows and how heads relate (issue 15): token relevance from attention
(:mod:`.methods`: head mean, last layer, rollout, gradient-weighted rollout, attention flow, PageRank)
and the head atlas (:mod:`.atlas`: Clark et al.'s Jensen-Shannon distance between heads, embedded
and clustered)."""
