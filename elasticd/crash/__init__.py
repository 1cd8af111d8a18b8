"""elasticd's own crash, invisible to the tenants: the running state kept where the next instance finds it."""
