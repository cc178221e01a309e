"""The SDKs are optional extras: building a model checks its SDK, a call imports it.

Each case runs in a fresh interpreter where the SDK cannot be imported (``sys.modules[name] =
None`` is how Python itself spells "this package is absent"), so the suite proves the message a
user without the extra sees, and that building a model imports no SDK and no HTTP client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKED = """
import json, sys
sys.modules[{package!r}] = None
from zett_agent.models import model_from_spec
from zett_agent.models.{module} import {cls}
out = {{}}
for name, build in (("class", lambda: {cls}("m", api_key="k")),
                    ("spec", lambda: model_from_spec({spec!r}, base_url="http://127.0.0.1:9"))):
    try:
        build()
    except ImportError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""

BUILT = """
import json, sys
from zett_agent.models import model_from_spec
model_from_spec("openai:m", base_url="http://127.0.0.1:9/v1")
model_from_spec("anthropic:m", base_url="http://127.0.0.1:9")
heavy = {"openai", "anthropic", "httpx", "httpcore", "ssl", "http.client"} & set(sys.modules)
print(json.dumps(sorted(heavy - {"ssl"})))  # asyncio may bring ssl on its own
"""


def run(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("package", "module", "cls", "spec"),
    [
        ("openai", "openai", "OpenAIChatModel", "openai:m"),
        ("anthropic", "anthropic", "AnthropicModel", "anthropic:m"),
    ],
)
def test_a_model_without_its_extra_fails_at_construction_with_the_install_command(
    package: str, module: str, cls: str, spec: str
) -> None:
    code = BLOCKED.format(package=package, module=module, cls=cls, spec=spec)
    out = run(code)
    assert isinstance(out, dict)
    command = f"pip install 'zett-agent[{package}]'"
    assert set(out) == {"class", "spec"}, out
    for message in out.values():
        assert command in message and cls in message and f"official {package} SDK" in message


def test_building_a_model_imports_neither_sdk_nor_an_http_client() -> None:
    assert run(BUILT) == []


CONCURRENT_FIRST_CALLS = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from support.openai_chunks import HELLO, TEXT_STREAM
from support.openai_loopback import LoopbackServer, Reply
from zett_agent.models.openai import OpenAIChatModel

async def one(model):
    return "".join(e.text for e in [e async for e in model.stream(HELLO)][:-1])

async def main():
    async with LoopbackServer([Reply(chunks=TEXT_STREAM)] * 20) as server:
        model = OpenAIChatModel("m", base_url=server.url)
        assert "openai" not in sys.modules
        print(sorted(set(await asyncio.gather(*(one(model) for _ in range(20))))))

asyncio.run(main())
"""


def test_concurrent_first_calls_wait_for_the_sdk_import_to_finish() -> None:
    """The first calls import the SDK in a thread; the others must not use it half built (a
    partially initialised ``openai`` has no ``AsyncOpenAI`` yet)."""
    tests = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", CONCURRENT_FIRST_CALLS.format(tests=tests)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "['Hello']"


WARMED_AS_THE_EXTENSION_OPENS = """
import asyncio, json, sys
from zett_agent.extensions.async_subagent import AsyncSubAgentExtension
from zett_agent.extensions.subagent import SubAgentDefinition
from zett_agent.models import _sdk_http
from zett_agent.models.anthropic import AnthropicModel
from zett_agent.models.openai import OpenAIChatModel
from zett_agent.runners import ProcessRunner
from zett_agent.runners._process import warming

async def main():
    models = [OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1"),
              AnthropicModel("m", base_url="http://127.0.0.1:9")]
    definitions = [SubAgentDefinition(f"d{{i}}", "d", "p", m) for i, m in enumerate(models)]
    runner = ProcessRunner(broker={broker})
    async with AsyncSubAgentExtension(definitions, runner=runner):
        await warming(runner)
        print(json.dumps({{
            "sdks": sorted({{"openai", "anthropic"}} & set(sys.modules)),
            "clients_ready": len(_sdk_http._ready),
            "tls_context": _sdk_http._context is not None,
        }}))

asyncio.run(main())
"""


@pytest.mark.parametrize("broker", [True, False], ids=["brokered-default", "unbrokered"])
def test_a_brokering_parent_imports_its_sdks_as_the_extension_opens(broker: bool) -> None:
    """Before any call: the SDKs, the TLS context and a first client of each SDK's HTTP
    client class, off the event loop, so the first brokered call does not wait hundreds of
    milliseconds for them. A parent whose children call their models themselves imports none."""
    out = run(WARMED_AS_THE_EXTENSION_OPENS.format(broker=broker))
    if broker:
        assert out == {"sdks": ["anthropic", "openai"], "clients_ready": 2, "tls_context": True}
    else:
        assert out == {"sdks": [], "clients_ready": 0, "tls_context": False}
