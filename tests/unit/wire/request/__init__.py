"""The tests of one module, ``llmobs/wire/request.py``, as a package: a request read and its
response written, each a test module (``test_reading``, ``test_writing``), since together they
are more than a test module's 450 lines."""
