"""Anthropic's Messages API (`POST /v1/messages`) on the router's HTTP front end."""
