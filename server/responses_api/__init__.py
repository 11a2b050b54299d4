"""OpenAI's Responses API (/v1/responses): its request and reply shapes, its translation onto
the chat path, its stream of events, and the database of stored responses."""
