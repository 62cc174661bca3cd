"""The client: one backend's requests over HTTP (client: BackendClient; discover: which model a server offers), the
streaming hot path (sseproto: our HTTP/1.1 reader, hotpath: what it hands back and the event loop it runs on; sse:
the SSE parser and the stream caps). The one place where HTTP errors become ours; a server's fault comes back as a
Reply value, never raised."""
