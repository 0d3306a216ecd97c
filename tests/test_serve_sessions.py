"""Sessions an agent cannot cross (issue 30, item 2): each external run's key is bound to its
own session, the server refuses any other session for it, and ``/health`` tells a caller
without a key nothing but that the server is up.

Before the fix, one key covered every session: run 0's agent posting to ``/s/<task>@1/...``
became run 1's main thread, and so run 1's training sample (the end-to-end test below got
200 and run 1's session held run 0's request).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import httpx
import pytest

from harnessrl.external.agents import AgentRun, ExternalAgent
from harnessrl.external.gold_replay import session_name
from harnessrl.external.install import InstallPlan, Package
from harnessrl.external.run import RELAY_PORT, AgentServer, ExternalConfig, run_task
from harnessrl.serve.auth import Credentials, Refused
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.verify import FileContains
from serve_helpers import Scripted, running
from test_external_failures import _install_fake, fake_agents_root  # noqa: F401 (a fixture)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def test_a_session_key_runs_as_its_session_and_may_name_no_other() -> None:
    credentials = Credentials("operator")
    first, second = credentials.issue("t@0"), credentials.issue("t@1")
    assert first != second and "t@0" not in first
    assert credentials.authorize([first], None) == "t@0"  # unnamed: the key's own session
    assert credentials.authorize(["", first], "t@0") == "t@0"
    with pytest.raises(Refused) as crossing:
        credentials.authorize([first], "t@1")
    assert crossing.value.status == 403 and first not in crossing.value.message
    assert credentials.authorize(["operator"], "t@1") == "t@1"  # the operator may name any
    with pytest.raises(Refused) as wrong:
        credentials.authorize(["guess"], "t@0")
    assert wrong.value.status == 401
    credentials.revoke("t@0")
    with pytest.raises(Refused):
        credentials.authorize([first], "t@0")
    assert credentials.authorize([second], None) == "t@1"  # the other run's key still holds


def test_without_any_key_configured_every_request_is_the_operators() -> None:
    credentials = Credentials()
    assert not credentials.required
    assert credentials.authorize([], "anything") == "anything"
    key = credentials.issue("t@0")  # once a session key exists, keys are required
    assert credentials.required and credentials.authorize([key], None) == "t@0"
    with pytest.raises(Refused):
        credentials.authorize([], "t@1")


def test_the_server_records_a_session_keys_requests_under_its_session_only() -> None:
    credentials = Credentials("operator")
    key0, _key1 = credentials.issue("task@0"), credentials.issue("task@1")
    with running(credentials=credentials) as (server, _policy, recorder), \
            httpx.Client(base_url=server.base_url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {key0}"}
        crossed = http.post("/s/task@1/v1/chat/completions", json=CHAT, headers=headers)
        assert crossed.status_code == 403 and crossed.json()["error"]["type"] == "permission_error"
        by_header = http.post("/v1/chat/completions", json=CHAT, headers={**headers, "x-harnessrl-session": "task@1"})
        assert by_header.status_code == 403
        anthropic = http.post("/s/task@1/v1/messages", json=CHAT, headers={"x-api-key": key0})
        assert anthropic.status_code == 403 and anthropic.json()["error"]["type"] == "permission_error"
        assert http.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        assert http.post("/s/task@0/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        assert recorder.sessions() == ["task@0"]  # task@1 holds nothing of run 0's
        assert len(recorder.records("task@0")) == 2
        operator = http.post("/s/task@1/v1/chat/completions", json=CHAT, headers={"x-api-key": "operator"})
        assert operator.status_code == 200 and "task@1" in recorder.sessions()


def test_health_without_a_key_says_only_that_the_server_is_up() -> None:
    with running(api_key="operator") as (server, _policy, _recorder), \
            httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/health", headers={"x-api-key": "wrong"}).json() == {"status": "ok"}
        full = http.get("/health", headers={"Authorization": "Bearer operator"}).json()
        assert full["status"] == "ok" and "requests" in full and full["model"] == "test-model"
    with running() as (server, _policy, _recorder), httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert "requests" in http.get("/health").json()  # no key configured: all of it, as before


class CrossingAgent(ExternalAgent):
    """An agent program that tries to write into run 1's conversation through the relay with
    the key it was given, then talks in its own session, and keeps both answers' status."""

    api = "chat"
    description = "a script that posts to another run's session"
    entries = ("agent.sh",)
    native = False
    name = "fake-crossing"
    packages = (Package("npm", "fake-crossing", "0.0.1"),)

    def plan(self) -> InstallPlan:
        return InstallPlan(self.packages, self.entries, native=False)

    def env(self, run: AgentRun) -> dict[str, str]:
        return {**super().env(run), "AGENT_KEY": run.api_key}

    def command(self, run: AgentRun, entry: str) -> str:
        body = json.dumps(CHAT)
        script = (
            "import json, os, urllib.request, urllib.error\n"
            "def post(path):\n"
            f"    request = urllib.request.Request('http://127.0.0.1:{RELAY_PORT}' + path, data={body!r}.encode(),\n"
            "        headers={'Authorization': 'Bearer ' + os.environ['AGENT_KEY'], 'Content-Type': 'application/json'})\n"
            "    try:\n"
            "        return urllib.request.urlopen(request, timeout=60).status\n"
            "    except urllib.error.HTTPError as exc:\n"
            "        return exc.code\n"
            f"codes = [post('/s/{session_name('fake/task-1', 1)}/v1/chat/completions'), post('/v1/chat/completions')]\n"
            "open('codes.txt', 'w').write(' '.join(map(str, codes)))\n"
        )
        return f"python3 -c {shlex.quote(script)} && cat codes.txt"


def test_an_agent_cannot_post_into_another_runs_session_end_to_end(fake_agents_root: Path) -> None:  # noqa: F811
    agent = CrossingAgent()
    _install_fake(fake_agents_root, agent)
    # passed only if the crossing got 403 and the agent's own session then answered 200
    task = Task(id="fake/task-1", instruction="Say hello.", verifier=FileContains("codes.txt", "403 200"),
                gold=[Action.write("codes.txt", "403 200")])
    with AgentServer(Scripted()) as server:
        victim = session_name(task.id, 1)
        server.session_key(victim)  # run 1 is in flight: its session is live
        trajectory = run_task(agent, task, server, ExternalConfig(time_limit_s=120), run=0)
        assert victim not in server.recorder.sessions()  # run 1's conversation holds nothing of run 0's
        assert trajectory.status != "error", trajectory.error
        assert trajectory.passed, trajectory.verdict
        assert len(trajectory.turns) == 1  # its own request; the refused one is nobody's turn
    assert trajectory.metrics["exit_code"] == 0
