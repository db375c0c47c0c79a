"""Remote engines: whole fills from an inference server, one object per dialect.

- generator: `RemoteGenerator` / `remote_engine`, one fill from the context to candidates;
- dialects: what each server speaks (request body and path, reading its replies), one
  class per dialect and the table `BY_NAME` of them (`DIALECTS`: their names);
- wire: the HTTP connection, streaming, timeouts, TLS, cancellation and faults;
- chat: the chat dialect's question, and its answers taken apart to the code for the hole.
"""
