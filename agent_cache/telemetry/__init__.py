"""What the gateway and ``ChatSGLang`` tell operators: OpenTelemetry spans (:mod:`.tracing`, with the
``agent-cache[otel]`` extra) and the gateway's access log (:mod:`.access_log`)."""
