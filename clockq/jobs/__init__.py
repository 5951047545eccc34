"""The domain: jobs, tiers, slices and events, their compare-and-set transitions, and the
services every client (web pages, API, admin, workers, beat) calls to change them."""
