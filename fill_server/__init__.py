"""The fill server: the engine behind OpenAI-compatible HTTP (`diffusion-infill serve`).

A front end beside the language server (lsp_server/): it turns HTTP requests into
`engine.fill.Engine` calls and back, and the engine knows nothing of HTTP. docs/serve.md
is the user's page; each module here has one job:

    config      ServeConfig: what the command line sets
    errors      ApiError: an HTTP status and a message for the client
    schema      the request bodies of the three fill endpoints, validated into a FillAsk
    body        reading a body within its size limit, as JSON
    auth        the API key (constant-time) and the loopback rule for binds
    filling     FillAsk -> an engine fill -> Outcome (budget, sampling, stop strings, tokens)
    scheduler   the bounded queue and the one worker that holds the model
    replies     an Outcome as each dialect's JSON and server-sent events
    stream      the server-sent event stream of one request
    metrics     counters and histograms, in Prometheus text
    app         the Starlette application: routes and thin handlers
    main        binding the socket and running uvicorn
"""
