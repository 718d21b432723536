"""OpenAI's Responses API (`POST /v1/responses`) on the router's HTTP front end."""
