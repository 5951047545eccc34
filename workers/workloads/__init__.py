"""Workloads: the code a job runs, one step at a time. Only names in settings may run."""
