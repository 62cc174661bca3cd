"""The client: one backend's requests over HTTP (client: BackendClient, discover), the streaming hot path (sseproto:
our HTTP/1.1 reader; sse: the SSE parser and the stream caps). The one place where HTTP errors become ours; a
server's fault comes back as a Reply value, never raised."""
