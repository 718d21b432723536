"""The router's HTTP front end: OpenAI's, Anthropic's and SGLang's APIs over the routing
core (app.py builds the aiohttp application; listener.py serves it)."""
