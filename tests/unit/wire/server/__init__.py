"""The tests of one module, ``llmobs/wire/server.py`` (the client leg's connection and
server), as a package: requests on a connection (``test_requests``) and a connection's life
(``test_lifetime``), each a test module, since together they are more than a test module's
450 lines. A request's own reading and writing: ``tests/unit/wire/request/``."""
