"""Thin bridges between a :class:`~toolfault.Guard` and each agent framework's tool protocol.

One module per framework, each importing its framework only inside itself, so ``import
toolfault`` never pulls in an SDK and every adapter is an optional extra
(``toolfault[openai]``, ``toolfault[anthropic]``, ``toolfault[mcp]``, ``toolfault[langchain]``,
``toolfault[agents]``):

- :mod:`toolfault.adapters.openai`: Chat Completions ``tool_calls`` and Responses
  ``function_call`` items (no error flag: the four-part text is the signal).
- :mod:`toolfault.adapters.anthropic`: ``tool_use`` blocks to ``tool_result`` blocks with
  ``is_error``.
- :mod:`toolfault.adapters.mcp`: an MCP server (official SDK, lowlevel ``Server``) whose
  failures are ``CallToolResult(is_error=True)`` with the problem as ``structured_content``;
  counters scoped per MCP session.
- :mod:`toolfault.adapters.langchain`: LangChain tools whose failures are
  ``ToolMessage(status="error")`` with our text; works inside LangGraph's ``ToolNode``.
- :mod:`toolfault.adapters.agents`: OpenAI Agents SDK ``FunctionTool`` objects backed by the
  guard, and a ``failure_error_function`` for tools decorated with the SDK directly.

Adapters never start a new turn: call ``guard.new_turn()`` when the *user* speaks, so that
identical retries across the model's own follow-up requests are counted and capped.
"""
