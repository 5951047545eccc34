"""The cluster's hosts and GPU workers as operators see them: which hosts run which roles, which
are live, which are drained for maintenance, and the marker that proves the hosts share one
checkpoint folder. Liveness itself is in Redis (clockq/bus/heartbeat.py); this is what must
survive a restart: the registry and the drains."""
