"""HTTP/2 through the proxy, on the `h2` library's sans-I/O state machine (decision 0019).

`client` is one client's HTTP/2 connection (h2c with prior knowledge, or TLS with ALPN
`h2`): the HTTP/1.1 `ClientConnection` hands its transport over when it sees the
connection preface (`preface`) or ALPN chose h2. Each stream is a `stream.H2Stream`,
which assigns the variant and forwards through an upstream leg: `upstream` multiplexes
streams over one HTTP/2 connection per upstream marked `h2c://` or `h2://`, `bridge`
carries a stream to an HTTP/1.1 upstream. `grpc` reads a call's outcome from its
grpc-status, `fields` translates heads, `guard` counts client abuse.
"""
