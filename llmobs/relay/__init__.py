"""The relay: one exchange between a client and the engine, in steps.

``proxy`` takes a request from the wire's server leg, opens the upstream leg and runs the
exchange (``Relay``, ``_Exchange``); ``response`` writes every chunk to the client first and
unchanged, then hands it to observation (the per-chunk path); ``headers`` says which headers
cross; ``failures`` how a failed request ends (outcome, status, message); ``observing`` what
the relay tells observation (and the null observer of ``--no-instrument``); ``inject`` asks
an engine for usage and strips it from what the client sees; ``deferred`` runs the work that
may wait until a response has gone. The relay may import the wire and observation; it reaches
export (a request's trace, its consumers) only through observation's shapes
(``observe.record``), which the assembly fills; nothing below imports it.
"""
