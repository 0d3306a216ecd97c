"""Serving a Policy over HTTP: OpenAI Chat Completions and Responses, Anthropic Messages.

``app.create_app`` builds the FastAPI application, ``runner.ServerThread`` runs it in a
thread (TCP or a Unix-domain socket), ``recorder.ConversationRecorder`` keeps every request's
exact token ids per client conversation and turns a conversation into a ``Trajectory``.
``context.ServeContext`` is what a policy sees of the request, and its docstring documents
the tool-call text format the server renders and parses.
"""
