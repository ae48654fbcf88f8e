"""The wire: both HTTP legs of the relay, and nothing of what is measured.

``server`` is the client's leg (an asyncio protocol), ``carrier`` its connection's state as
its protocol and its requests move it, and ``request`` what its handler gets; ``upstream`` the
engine's (a pool of ``connection.Connection``); ``states`` each leg's states and transition
tables, and ``flow`` the flow control both legs share (reading held or deferred to the next
loop turn); ``http1`` the sans-I/O HTTP/1.1 they share (heads, bodies, and policy as pure
functions, as h11 does), ``listen`` how a bind that fails is told. The wire may import
``llmobs.config`` and nothing of ``relay``, ``observe`` or ``export`` (import-linter checks it).
"""
