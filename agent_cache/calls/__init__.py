"""One call pipeline for both front doors (``ChatSGLang`` and ``agent-cache serve``).

A call's walk, whichever door it came in by:

1. :func:`~agent_cache.calls.prepare.prepare` checks the request and builds a
   :class:`~agent_cache.calls.prepare.Call` (the worker's body, the route
   request, the template to record);
2. :class:`~agent_cache.routing.lifecycle.CallLifecycle` routes it, retries
   it elsewhere while nothing reached the caller, and settles each attempt;
3. each attempt (:mod:`agent_cache.calls.attempt`) goes over a
   :class:`~agent_cache.calls.transport.WorkerTransport` (httpx, or the
   gateway's optional fast path) within the worker's deadline: a stream's
   lines go through the one :class:`~agent_cache.calls.reader.EventReader`
   from its first byte on; a call sent whole (the gateway's whole calls) waits
   for the worker's whole answer, as long as the worker answers its ``/health``;
4. the door turns the answer into its own (the gateway passes events or the
   whole answer on; ``ChatSGLang`` parses events into chunks), then runs
   :class:`~agent_cache.calls.served.Served`.
"""
