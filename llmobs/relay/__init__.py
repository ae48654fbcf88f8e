"""The relay: one exchange between a client and the engine, in steps.

``proxy`` takes a request from the wire's server leg, opens the upstream leg, writes every
chunk to the client first and unchanged, then hands it to observation; ``inject`` asks an
engine for usage and strips it from what the client sees; ``deferred`` runs the work that may
wait until a response has gone. The relay may import the wire, observation and export's
tracing (a server span must exist before the request goes upstream); export never imports it.
"""
