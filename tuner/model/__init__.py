"""The cost model: step-time curves and acceptance fitted separately to stored levels, giving
tok/s at every concurrency for plain, always-draft and threshold policies, with intervals."""
