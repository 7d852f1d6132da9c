"""`GET /metrics`: the receiver's own figures (`endpoint`) and the fleet's, read from Redis
(`fleet`) and named as Prometheus families (`families`)."""
