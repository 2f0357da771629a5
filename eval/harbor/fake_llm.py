"""A scripted, OpenAI-compatible chat-completions server on 127.0.0.1: the LLM for real Harbor agent runs in tests.

Why: post-eval analysis reads each trial's `agent/trajectory.json` (Harbor's ATIF), and only an LLM agent writes
one (`oracle` and `nop` do not). No real LLM can run on the test machines (no GPU, no network), so Harbor's real
`terminus-2` agent is pointed at this server instead. It is the ONLY fake in such a run: Harbor, terminus-2, its
litellm client, its response parser, the tmux session and `host_env.py` are all real, and the trajectories are
written by Harbor's own code (per-step `metrics` and `final_metrics` come from the `usage` blocks sent here).

How: a task's instruction names its script (`fake-llm-script: NAME`, see `eval/harbor/agent-dataset/`). The
server is stateless per conversation: the reply to a request is the script's entry number "assistant messages
already in the request", so concurrent trials never mix. Each reply is a terminus-2 JSON answer plus a `usage`
block with the script's token counts; every request served is recorded (`FakeLLM.calls`, with its script and
turn: one conversation per script as long as each task runs once).

A misbehaving server, for the launch-health rules (off by default): `bad_request_every=N` answers every Nth
chat-completions request HTTP 400 (what vLLM answers a prompt over its context window), whatever it asks; and
`access_log` prints one line per request the way vLLM's uvicorn server does, plus uvicorn's startup lines once
listening, which is what the reconciler reads in a job's output:

    INFO:     Application startup complete.
    INFO:     127.0.0.1:53312 - "POST /v1/chat/completions HTTP/1.1" 200 OK
    INFO:     127.0.0.1:53318 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request

A quiet-dead server, for the admission gate's traffic rule (RULES §14; `mode`, default `script`, the behaviour
above): a model server that is up and takes requests, yet never gives the agent one output token.
- `empty`: every chat completion is answered 200 with an empty completion (content "", usage with prompt tokens
  and `completion_tokens: 0`, as a vLLM whose model emits EOS at once), whatever the script: the agent runs, gets
  nothing, and the verifier grades the untouched workspace.
- `silent`: every chat-completions request is read and never answered: its handler waits, in small steps, until
  the client hangs up (the agent's timeout), the server stops, or `silent_cap_s` (120 s) has passed, then closes
  the connection without a response. No access line either (uvicorn prints one per response).
From the command line the mode is `--mode`, by default the environment's `FAKE_LLM_MODE` (how a job script's
environment selects it: tests/fixtures/terminus2_job.sh starts this file with the job's environment).

Stdlib only, so the reconciler's Python 3.11 (tests, in a thread) and the eval env's 3.12 (CLI) both run it:

    python eval/harbor/fake_llm.py [--port N]    # prints "fake-llm listening on http://127.0.0.1:PORT/v1"
    python eval/harbor/fake_llm.py --access-log --bad-request-every 3 --url-file F   # as a job runs vLLM
    FAKE_LLM_MODE=silent python eval/harbor/fake_llm.py --access-log --url-file F      # quiet-dead (or --mode)
    harbor run ... -a terminus-2 -m openai/fake-model --ak api_base=http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

MODEL = "fake-model"
SCRIPT_TAG = re.compile(r"fake-llm-script:\s*([\w-]+)")
MODES = ("script", "empty", "silent")  # see the module's docstring; `script` is the default
MODE_ENV = "FAKE_LLM_MODE"  # the command line's default --mode
SILENT_CAP_S = 120.0  # the longest a `silent` handler holds a request (a test can never hang on it)
SILENT_STEP_S = 0.2


@dataclass(frozen=True)
class Reply:
    """One assistant turn: the text terminus-2 parses, and the token counts reported for it."""

    content: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class Call:
    """One chat-completions request served."""

    script: str
    turn: int  # index into the script (= assistant messages already in the conversation)
    model: str
    reply: Reply


def terminus_json(plan: str, commands: list[str] | tuple[str, ...] = (), task_complete: bool = False,
                  duration: float = 0.2) -> str:
    """A reply in terminus-2's JSON format (harbor/agents/terminus_2/templates/terminus-json-plain.txt)."""
    return json.dumps({
        "analysis": f"Scripted by fake_llm: {plan.lower()}",
        "plan": plan,
        "commands": [{"keystrokes": keys, "duration": duration} for keys in commands],
        "task_complete": task_complete,
    }, indent=2)


# terminus-2 finishes only when `task_complete: true` comes twice in a row (the second confirms after Harbor
# shows the terminal again), so every script ends with two of them. A trajectory has one user step (the
# initial prompt) and then one agent step per reply: steps = 1 + len(script).
SCRIPTS: dict[str, tuple[Reply, ...]] = {
    # solves it at once, then confirms: 3 steps, reward 1
    "quick": (
        Reply(terminus_json("Write the file and finish.", ["echo hello > hello.txt\n"], task_complete=True), 812, 61),
        Reply(terminus_json("Confirm completion.", task_complete=True), 1003, 17, cached_tokens=768),
    ),
    # looks around first, checks its work, then finishes: 5 steps, reward 1
    "steps": (
        Reply(terminus_json("Look at the working directory.", ["ls -la\n"]), 820, 45),
        Reply(terminus_json("Write the file and show it.", ["echo hello > hello.txt\n", "cat hello.txt\n"]), 1240, 88,
              cached_tokens=800),
        Reply(terminus_json("The file says hello: done.", task_complete=True), 1533, 29, cached_tokens=1200),
        Reply(terminus_json("Confirm completion.", task_complete=True), 1710, 15, cached_tokens=1500),
    ),
    # an unparsable answer (Harbor records it and asks again), a wrong file, a withdrawn completion: 6 steps,
    # reward 0
    "wrong": (
        Reply("I think I should write a file.", 805, 9),
        Reply(terminus_json("Write the file and finish.", ["echo goodbye > hello.txt\n"], task_complete=True), 990, 57),
        Reply(terminus_json("Check the file once more before confirming.", ["cat hello.txt\n"]), 1320, 33,
              cached_tokens=960),
        Reply(terminus_json("Finish.", task_complete=True), 1610, 14, cached_tokens=1300),
        Reply(terminus_json("Confirm completion.", task_complete=True), 1790, 12, cached_tokens=1600),
    ),
}


def expected_steps(script: str) -> int:
    """Steps of the trajectory terminus-2 writes for a run of `script` (its user step + one per reply)."""
    return 1 + len(SCRIPTS[script])


def expected_tokens(script: str) -> tuple[int, int]:
    """(prompt, completion) tokens a full run of `script` reports."""
    replies = SCRIPTS[script]
    return sum(r.prompt_tokens for r in replies), sum(r.completion_tokens for r in replies)


class FakeLLM:
    """The server, in a daemon thread: `with FakeLLM() as llm: ... llm.base_url ... llm.calls`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 scripts: dict[str, tuple[Reply, ...]] | None = None, bad_request_every: int = 0,
                 access_log: TextIO | None = None, mode: str = "script", silent_cap_s: float = SILENT_CAP_S) -> None:
        if bad_request_every < 0:
            raise ValueError(f"bad_request_every must be 0 (never) or more, not {bad_request_every}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.silent_cap_s = silent_cap_s
        self._stopping = threading.Event()  # set by stop(): `silent` handlers let go of their requests
        self._held = 0  # chat-completions requests a `silent` handler took and never answered
        self.scripts = SCRIPTS if scripts is None else scripts
        self.bad_request_every = bad_request_every  # every Nth chat-completions request is answered 400; 0: none
        self.access_log = access_log  # where uvicorn-style startup and access lines go; None: nowhere
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._calls: list[Call] = []
        self._errors: list[str] = []
        self._requests = 0  # chat-completions requests answered (rejected ones included)
        self._rejected = 0
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-llm", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    @property
    def errors(self) -> list[str]:
        """Requests answered with an error (unknown script, script exhausted, malformed request)."""
        with self._lock:
            return list(self._errors)

    @property
    def held(self) -> int:
        """Chat-completions requests taken and never answered (`silent`)."""
        with self._lock:
            return self._held

    @property
    def rejected(self) -> int:
        """Requests answered 400 on purpose (`bad_request_every`); not in `errors`."""
        with self._lock:
            return self._rejected

    def start(self) -> FakeLLM:
        self._thread.start()
        self.announce()
        return self

    def announce(self) -> None:
        """uvicorn's startup lines, vLLM's ready signal (the socket listens from the constructor on)."""
        self.log(f"INFO:     Started server process [{os.getpid()}]")
        self.log("INFO:     Waiting for application startup.")
        self.log("INFO:     Application startup complete.")
        host, port = self._server.server_address[:2]
        self.log(f"INFO:     Uvicorn running on http://{host!s}:{port} (Press CTRL+C to quit)")

    def log(self, line: str) -> None:
        """One line to the access log, whole (handler threads print concurrently)."""
        if self.access_log is None:
            return
        with self._log_lock:
            self.access_log.write(line + "\n")
            self.access_log.flush()

    def log_access(self, client: tuple[str, int], request_line: str, status: int) -> None:
        """uvicorn's access line: `INFO:     127.0.0.1:53312 - "POST /v1/chat/completions HTTP/1.1" 200 OK`."""
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        self.log(f'INFO:     {client[0]}:{client[1]} - "{request_line}" {status} {phrase}'.rstrip())

    def stop(self) -> None:
        self._stopping.set()  # first: a `silent` handler returns within a step
        self._server.shutdown()  # waits for serve_forever to return
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold(self, connection: socket.socket) -> None:
        """`silent`: keep a request unanswered until its client hangs up, the server stops or the cap passes."""
        with self._lock:
            self._held += 1
        deadline = time.monotonic() + self.silent_cap_s
        while time.monotonic() < deadline and not self._stopping.wait(SILENT_STEP_S):
            if _hung_up(connection):
                return

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON body for one chat-completions request."""
        if self.mode == "empty":
            return self._empty(body)
        with self._lock:
            self._requests += 1
            reject = self.bad_request_every > 0 and self._requests % self.bad_request_every == 0
            self._rejected += int(reject)
        if reject:  # the shape of vLLM's 400 (an OpenAI error object), not a context-window message on purpose
            return 400, {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                         "message": f"fake_llm answers every {self.bad_request_every}th request 400 (on purpose)"}
        messages = body.get("messages")
        if body.get("stream"):
            return self._error(400, "streaming is not supported by fake_llm")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return self._error(400, "messages must be a non-empty list of objects")
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        match = SCRIPT_TAG.search(_text(first_user.get("content"))) if first_user else None
        if match is None or match.group(1) not in self.scripts:
            return self._error(404, f"no known 'fake-llm-script: NAME' in the first user message ({match and match[1]})")
        script = match.group(1)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        replies = self.scripts[script]
        if turn >= len(replies):
            return self._error(409, f"script {script!r} has {len(replies)} replies; asked for reply {turn + 1}")
        reply = replies[turn]
        model = str(body.get("model") or MODEL)
        with self._lock:
            self._calls.append(Call(script, turn, model, reply))
        usage: dict[str, Any] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        if reply.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        return 200, {
            "id": f"chatcmpl-fake-{script}-{turn}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content},
                         "finish_reason": "stop"}],
            "usage": usage,
        }

    def _empty(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """`empty`: a 200 with no completion at all (0 completion tokens), whatever the request asks."""
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        texts = [_text(m.get("content")) for m in messages if isinstance(m, dict)]
        first_user = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        match = SCRIPT_TAG.search(_text(first_user.get("content"))) if first_user else None
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        prompt_tokens = max(1, sum(len(t) for t in texts) // 4)  # the prompt was read: a plausible count
        model = str(body.get("model") or MODEL)
        with self._lock:
            self._requests += 1
            number = self._requests
            self._calls.append(Call(match.group(1) if match else "", turn, model, Reply("", prompt_tokens, 0)))
        return 200, {
            "id": f"chatcmpl-fake-empty-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
        }

    def _error(self, status: int, message: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._errors.append(message)
        return status, {"error": {"message": message, "type": "invalid_request_error", "code": status}}


def _text(content: object) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _hung_up(connection: socket.socket) -> bool:
    """The client closed its end (or reset it): the socket reads EOF. Nothing more is ever expected of it."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _handler(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as OpenAI clients expect

        def do_GET(self) -> None:  # readiness probe, and what `GET /v1/models` answers
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, {"error": {"message": "body is not JSON"}})
                return
            if not isinstance(body, dict):
                self._send(400, {"error": {"message": "body is not a JSON object"}})
                return
            if llm.mode == "silent":
                llm.hold(self.connection)
                self.close_connection = True  # no response, ever: the connection just ends
                return
            status, answer = llm.answer(body)
            self._send(status, answer)

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if isinstance(code, int):  # send_response's call (an HTTPStatus is an int too)
                llm.log_access(self.client_address[:2], self.requestline, int(code))

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: tests read `calls`/`errors` instead

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--bad-request-every", type=int, default=0, metavar="N",
                        help="answer every Nth chat-completions request HTTP 400 (0: never)")
    parser.add_argument("--access-log", action="store_true",
                        help="print uvicorn's startup lines and an access line per request on stdout, as vLLM does")
    parser.add_argument("--url-file", type=Path, help="write the base URL here (atomically) once listening")
    parser.add_argument("--mode", choices=MODES, default=os.environ.get(MODE_ENV) or "script",
                        help=f"script (default), empty (200s with no completion) or silent (never answers); "
                             f"default: ${MODE_ENV}, else script")
    parser.add_argument("--silent-cap", type=float, default=SILENT_CAP_S, metavar="SECONDS",
                        help="silent: the longest a request is held before its connection is closed unanswered")
    args = parser.parse_args()
    llm = FakeLLM(args.host, args.port, bad_request_every=args.bad_request_every,
                  access_log=sys.stdout if args.access_log else None, mode=args.mode, silent_cap_s=args.silent_cap)
    print(f"fake-llm listening on {llm.base_url}" + ("" if llm.mode == "script" else f" (mode {llm.mode})"),
          flush=True)
    llm.announce()
    if args.url_file is not None:
        partial = args.url_file.with_name(f".{args.url_file.name}.tmp")
        partial.write_text(llm.base_url + "\n")
        os.replace(partial, args.url_file)
    try:
        llm._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        llm._server.server_close()


if __name__ == "__main__":
    main()
