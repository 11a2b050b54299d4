"""Anthropic's Messages API (`/v1/messages`), served by translating each request onto the chat
completions path (server/routes/chat.py): the same template, tools, constraints, limits and
generation; only the shapes of requests, replies, stream events and errors are Anthropic's."""
