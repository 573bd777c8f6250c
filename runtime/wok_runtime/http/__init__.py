"""The HTTP side: the OpenAI-compatible API over the engine (`app`, `openai_routes`, `server`),
its admin routes, body parsing and limits, metrics, drain, and `serve`, which builds it all."""
