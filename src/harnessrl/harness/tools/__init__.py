"""Factor T, the tool interface: one module per realization, and what they share.

In the space: ``shell_block`` (T0), ``editor_json`` (T1), ``tagged`` (T2). Outside it:
``codex`` (with its patch grammar in ``codex_patch``) and ``aider``. Shared: ``common``
(paths, file text, outputs, fenced blocks, the oracle's shell commands), ``arguments`` (JSON
schemas and calls), ``schema`` (the ``SchemaToolInterface`` base) and ``tool_call`` (the
``<tool_call>`` syntax, also used by ``harnessrl serve``).

No interface stops generation at a text sequence: several allow more than one call per
response, so generation ends at the chat template's end-of-turn token.
"""
