"""Planning a sweep: what its runs will take (the cost model, GPU prices, the dry run) and how many
workers train it."""
