"""Measuring: launch llama-server (server), drive it with concurrent streams (load), read its
/metrics (metrics) and the bare kernels (kernel), fingerprint what was measured (fingerprint),
and run a profile plan level by level, storing each repeat as it finishes (profiler)."""
