"""Thin bridges between a :class:`~toolfault.Guard` and each agent framework's tool protocol.

One module per framework, each importing its framework only inside itself, so ``import
toolfault`` never pulls in an SDK and every adapter is an optional extra
(``toolfault[openai]``, ``toolfault[anthropic]``, ``toolfault[mcp]``, ``toolfault[langchain]``,
``toolfault[agents]``, ``toolfault[pydantic-ai]``, ``toolfault[adk]``); imported without its
framework, an adapter raises ``ModuleNotFoundError`` naming the ``pip install`` to run (the
OpenAI and Anthropic adapters read plain dicts too, and need no SDK):

- :mod:`toolfault.adapters.openai`: Chat Completions ``tool_calls`` and Responses
  ``function_call`` items (no error flag: the four-part text is the signal).
- :mod:`toolfault.adapters.anthropic`: ``tool_use`` blocks to ``tool_result`` blocks with
  ``is_error``.
- :mod:`toolfault.adapters.mcp`: an MCP server (official SDK, lowlevel ``Server``) whose
  failures are ``CallToolResult(is_error=True)`` with the problem as ``structured_content``;
  counters scoped per MCP session.
- :mod:`toolfault.adapters.langchain`: LangChain tools whose failures are
  ``ToolMessage(status="error")`` with our text and the problem as ``artifact``; works inside
  LangGraph's ``ToolNode``.
- :mod:`toolfault.adapters.agents`: OpenAI Agents SDK ``FunctionTool`` objects backed by the
  guard, and a ``failure_error_function`` for tools decorated with the SDK directly.
- :mod:`toolfault.adapters.pydantic_ai`: ``GuardedToolset``, any Pydantic AI toolset whose
  calls run through the guard; failures are ``ToolFailed`` results, which use no retry budget.
- :mod:`toolfault.adapters.adk`: ``ToolfaultPlugin``, a Google ADK plugin guarding every tool
  of every agent of a runner.

Every adapter scopes counters to the conversation by itself (a LangGraph ``thread_id``, an
Agents SDK run, an MCP session or client, an OpenAI/Anthropic ``conversation=``, a Pydantic AI
``conversation_id``, an ADK session) and starts a new turn where the framework shows one (a new
user message in ``messages=``, a new run or invocation), and every adapter hands a halt on in
the framework's own way (``halt_middleware``/``halt_hook``, ``stop_on_halt``,
``ToolOutputs.halt``, ``structuredContent["halt"]``, a ``"Stopped: ..."`` run output or final
response).  Adapters answer only the calls of tools
registered on the guard unless told otherwise.
"""
